"""HICRA (``credit=hicra``): A'(t) = A + α·|A|·m(t) on the tokens a detector marks as planning, the detectors'
token spans on a real tokenizer, the coverage it logs, and the settings it refuses."""

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.validate import check_overrides
from marl_cli.core.samples import Sample
from marl_cli.credit.base import shape_advantages
from marl_cli.credit.hicra import DETECTORS, HicraConfig, hicra, spans_to_tokens
from marl_cli.policies.tiny import build_tiny_tokenizer
from tests.helpers import FAST, train_config


def test_the_formula_on_a_known_mask():
    # A = 1, -1, 0.5, -2, 0 with tokens 0 and 1 and 4 marked, α = 0.2
    assert hicra([1.0, -1.0, 0.5, -2.0, 0.0], [True, True, False, False, True], 0.2) == pytest.approx(
        [1.2, -0.8, 0.5, -2.0, 0.0], abs=1e-15)


def test_token_spans_follow_the_characters():
    pieces = ["Let", " me", " check", ":", " R", " D", " ####", " R"]
    assert spans_to_tokens(pieces, [(0, 6)]) == [True, True, False, False, False, False, False, False]
    assert spans_to_tokens(pieces, [(7, 9)]) == [False, False, True, False, False, False, False, False]
    assert spans_to_tokens(pieces, []) == [False] * len(pieces)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _pieces(tokenizer, text):
    return [tokenizer.decode([t], skip_special_tokens=False) for t in tokenizer(text).input_ids]


def test_the_phrase_detector_marks_the_tokens_of_each_phrase(tokenizer):
    text = "Let me check the map. R R D #### R R D"
    pieces = _pieces(tokenizer, text)
    assert "".join(pieces) == text
    marks = DETECTORS["phrases"](pieces, OmegaConf.structured(HicraConfig(name="hicra")), None)
    marked = "".join(p for p, m in zip(pieces, marks, strict=True) if m)
    assert marked.replace(" ", "").lower() == "letmecheck"


@pytest.mark.parametrize(("text", "phrases", "marked"), [
    ("step by step by step!", ["step by step"], "step by step by step"),  # the second occurrence starts in the first
    ("abababa", ["aba"], "abababa"),  # three occurrences at 0, 2 and 4, each overlapping the next
    ("xaaay", ["aa"], "aaa"),
    ("Step BY step", ["step by step"], "Step BY step"),  # case-insensitive, the text's own case kept
])
def test_the_phrase_detector_marks_every_occurrence_overlapping_ones_too(phrases, text, marked):
    pieces = list(text)  # one token per character: the marks are exactly the occurrences' union
    credit = OmegaConf.structured(HicraConfig(name="hicra", phrases=phrases))
    marks = DETECTORS["phrases"](pieces, credit, None)
    assert "".join(p for p, m in zip(pieces, marks, strict=True) if m) == marked


def test_the_before_answer_detector_marks_what_precedes_the_last_marker(tokenizer):
    cfg = SimpleNamespace(workflow=SimpleNamespace(answer_marker="####"))
    pieces = _pieces(tokenizer, "go right then down #### R D")
    marks = DETECTORS["before_answer"](pieces, None, cfg)
    assert "".join(p for p, m in zip(pieces, marks, strict=True) if m) == "go right then down "
    assert not any(DETECTORS["before_answer"](_pieces(tokenizer, "R D"), None, cfg))
    whole = SimpleNamespace(workflow=SimpleNamespace(answer_marker=""))  # the whole reply is the answer
    assert not any(DETECTORS["before_answer"](pieces, None, whole))


def test_hicra_gives_each_row_token_advantages_and_logs_what_it_marked(tokenizer):
    cfg = train_config(*FAST, "credit=hicra", "credit.alpha=0.5", "credit.detector=before_answer")
    run = SimpleNamespace(policies={"shared": SimpleNamespace(tokenizer=tokenizer)}, cfg=cfg)
    ids = tokenizer("ab #### c").input_ids  # 'a', 'b', ' ' before the marker: 3 of 8 tokens
    rows = [Sample(task=0, branch=b, turn=0, role="agent", policy="shared", prompt_ids=[1], completion_ids=ids,
                   reward=0.0, advantage=a) for b, a in enumerate([2.0, -2.0, 0.0])]
    stats = shape_advantages(rows, cfg, run)
    assert rows[0].token_advantages == [3.0] * 3 + [2.0] * (len(ids) - 3)
    assert rows[1].token_advantages == [-1.0] * 3 + [-2.0] * (len(ids) - 3)
    assert rows[2].token_advantages == [0.0] * len(ids) and not rows[2].trains()
    assert stats["credit/hicra_marked_fraction"] == pytest.approx(3 / len(ids), abs=1e-15)
    assert stats["credit/hicra_marked_fraction/agent"] == stats["credit/hicra_marked_fraction"]


@pytest.mark.parametrize(("overrides", "message"), [
    ("credit=hicra credit.detector=nope", "credit.detector='nope' is not registered; choose from: before_answer"),
    ("credit=hicra credit.phrases=[]", "credit.detector=phrases with no credit.phrases marks nothing"),
    ("credit=hicra credit.alpah=0.3", "credit.alpah: no such key; valid keys: name, alpha"),
    ("credit=hicra credit.alpha=-1", "credit.alpha=-1.0: must be >= 0.0"),
    ("credit=hicrra", "credit=hicrra: no such option; choose from: "),
])
def test_bad_settings_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_overrides("train", overrides.split())
    assert message in str(err.value) and "\n" not in str(err.value)
