"""The judge's verdict line: what it is told to write, and the score parsed from what it wrote (hand-computed)."""

from __future__ import annotations

import pytest

from marl_cli.config.errors import ConfigError
from marl_cli.core.verdicts import Scale, check_template, check_verdict, render


@pytest.mark.parametrize(("reply", "expected"), [
    ("The answer is right.\nScore: 7", (0.7, "")),
    ("Score: 10", (1.0, "")),
    ("Score:0", (0.0, "")),
    ("Score: 2.5 because ...", (0.25, "")),
    ("Score: 3\nOn reflection, Score: 9", (0.9, "")),  # the last verdict line counts
    ("Score: .5", (0.05, "")),
])
def test_a_good_verdict_maps_the_number_onto_zero_one(reply, expected):
    value, why = Scale("Score: {score}", 0, 10).parse(reply)
    assert value == pytest.approx(expected[0], abs=1e-12) and why == expected[1]


@pytest.mark.parametrize("reply", ["I think it is correct", "Score: high", "score 7", "", "Scores: ten"])
def test_a_reply_without_the_verdict_line_is_a_parse_failure(reply):
    assert Scale().parse(reply) == (None, "parse")


@pytest.mark.parametrize("reply", ["Score: 11", "Score: -1", "Score: 10.5"])
def test_a_number_outside_the_range_is_out_of_range(reply):
    assert Scale().parse(reply) == (None, "range")


def test_a_verdict_with_text_after_the_slot_and_a_negative_range():
    scale = Scale("[[{score}]]", -1, 1)
    assert scale.instruction == "[[<-1-1>]]"
    assert scale.parse("rating [[-0.5]]") == (pytest.approx(0.25), "")
    assert scale.parse("rating [[-0.5]") == (None, "parse")


@pytest.mark.parametrize("verdict", ["Score:", "Score: {value}", "{score} and {score}", "Score: {score} {role}"])
def test_a_verdict_without_exactly_one_score_slot_is_refused(verdict):
    with pytest.raises(ConfigError, match=r"exactly one \{score\} slot"):
        check_verdict(verdict)


def test_a_scale_whose_high_is_not_above_its_low_is_refused():
    with pytest.raises(ConfigError, match="must be above"):
        Scale("Score: {score}", 5, 5)


@pytest.mark.parametrize(("template", "match"), [
    ("Grade {answer}. {verdict} {reference}", r"unknown fields \['reference'\]"),
    ("Grade this. {verdict}", "nothing to judge"),
    ("Grade {answer}.", r"add the \{verdict\} field"),
    ("Grade {answer", "does not parse"),
])
def test_a_malformed_rubric_is_refused_in_one_line(template, match):
    with pytest.raises(ConfigError, match=match):
        check_template(template, "reward.template")


def test_the_rubric_shows_the_reply_and_the_instruction():
    text = render("Q: {prompt}\nA: {answer} ({role})\n{verdict}", Scale(low=1, high=5), prompt="2+2?",
                  completion="#### 4", answer="4", role="solver")
    assert text == "Q: 2+2?\nA: 4 (solver)\nScore: <1-5>"
