"""A reward model applied to a step's rows: the reward formula, the cache, the cap, failures and agreement."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from marl_cli.core.samples import Sample
from marl_cli.policies.tiny import build_tiny_tokenizer
from marl_cli.rewards.base import Judged, ModelRewards, RewardModel, Verdict

TOKENIZER = build_tiny_tokenizer()


class Table(RewardModel):
    """Scores a reply from a table of answers (None: a parse failure), recording what it was asked."""

    def __init__(self, table: dict[str, float | None]):
        self.table = table
        self.asked: list[Judged] = []

    def score(self, items: list[Judged]) -> list[Verdict]:
        self.asked += items
        return [Verdict(self.table.get(i.answer), "" if self.table.get(i.answer) is not None else "parse", 3)
                for i in items]


def row(reply: str, reward: float = 0.5, success: bool = False, role: str = "solver", prompt: str = "2+2?") -> Sample:
    ids = TOKENIZER(prompt, add_special_tokens=False).input_ids
    return Sample(0, 0, 0, role, "shared", ids, TOKENIZER(reply, add_special_tokens=False).input_ids, reward,
                  success=success)


def rewards(table: dict[str, float | None], **changes) -> tuple[ModelRewards, Table]:
    cfg = OmegaConf.create({"roles": ["solver"], "weight": 1.0, "program_weight": 0.0, "invalid": -0.5,
                            "max_calls": 0, "cache_size": 100, "agreement_threshold": 0.5, **changes})
    model = Table(table)
    parse = lambda text: text.rsplit("####", 1)[1].strip() if "####" in text else None  # noqa: E731
    return ModelRewards(cfg, model, parse, {"shared": TOKENIZER}), model


def test_the_reward_is_weight_times_score_plus_program_weight_times_the_program_reward():
    applier, _ = rewards({"4": 0.8}, weight=2.0, program_weight=0.5)
    rows = [row("#### 4", reward=1.0, success=True)]
    applier.apply(rows)
    assert rows[0].reward == pytest.approx(2.0 * 0.8 + 0.5 * 1.0)
    assert rows[0].info["program_reward"] == 1.0 and rows[0].info["judge_score"] == 0.8


def test_other_roles_and_rows_without_tokens_keep_their_reward():
    applier, model = rewards({"4": 1.0})
    other, scripted = row("#### 4", role="proposer"), row("#### 4")
    scripted.completion_ids = []
    assert applier.apply([other, scripted]) == {}
    assert other.reward == scripted.reward == 0.5 and model.asked == []


def test_identical_replies_are_judged_once_and_cached_across_steps():
    applier, model = rewards({"4": 1.0, "5": 0.0})
    first = applier.apply([row("#### 4"), row("#### 4"), row("#### 5")])
    assert first["judge/calls"] == 2 and first["judge/cache_hits"] == 0 and first["judge/tokens"] == 6
    second = applier.apply([row("#### 4"), row("#### 6")])
    assert second["judge/calls"] == 1 and second["judge/cache_hits"] == 1
    assert [j.answer for j in model.asked] == ["4", "5", "6"]


def test_the_same_reply_to_another_prompt_is_judged_again():
    applier, model = rewards({"4": 1.0})
    applier.apply([row("#### 4", prompt="2+2?"), row("#### 4", prompt="3+1?")])
    assert [j.prompt for j in model.asked] == ["2+2?", "3+1?"]


def test_a_reply_the_model_cannot_score_gets_the_invalid_value_and_is_counted():
    applier, _ = rewards({"4": 1.0})
    rows = [row("#### 4"), row("no answer"), row("#### 7")]
    stats = applier.apply(rows)
    assert [r.reward for r in rows] == [1.0, -0.5, -0.5]
    assert stats["judge/parse_failures"] == 2 and stats["judge/score"] == pytest.approx((1.0 - 0.5 - 0.5) / 3)


def test_beyond_max_calls_a_row_gets_the_invalid_value_and_is_counted_not_cached():
    applier, _ = rewards({"1": 1.0, "2": 1.0, "3": 1.0}, max_calls=2)
    rows = [row("#### 1"), row("#### 2"), row("#### 3")]
    stats = applier.apply(rows)
    assert stats["judge/calls"] == 2 and stats["judge/over_cap"] == 1
    assert [r.reward for r in rows] == [1.0, 1.0, -0.5]
    assert applier.apply([row("#### 3")])["judge/calls"] == 1  # judged the next step


def test_agreement_compares_the_judge_with_the_program_on_scored_rows():
    applier, _ = rewards({"4": 0.9, "5": 0.7, "6": 0.1, "x": None})
    rows = [row("#### 4", success=True), row("#### 5", success=False), row("#### 6", success=False),
            row("#### x", success=True)]
    assert applier.apply(rows)["judge/agreement"] == pytest.approx(2 / 3)


def test_the_cache_keeps_the_most_recent_pairs():
    applier, model = rewards({"1": 1.0, "2": 1.0, "3": 1.0}, cache_size=2)
    applier.apply([row("#### 1"), row("#### 2")])
    applier.apply([row("#### 1")])  # 1 is now the most recent
    applier.apply([row("#### 3")])  # evicts 2
    applier.apply([row("#### 1"), row("#### 2")])
    assert [j.answer for j in model.asked] == ["1", "2", "3", "2"]
