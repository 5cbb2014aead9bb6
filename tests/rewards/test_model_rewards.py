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


class Preferring(RewardModel):
    """Pairwise: prefers the larger answer; ``first`` adds a bias toward the reply shown first (a tie becomes a
    first-position win)."""

    def __init__(self, first: bool = False):
        self.first = first
        self.asked: list[Judged] = []

    def score(self, items: list[Judged]) -> list[Verdict]:
        self.asked += items
        out = []
        for i in items:
            a, b = int(i.answer), int(i.rival_answer)
            out.append(Verdict(0.0 if (a > b or (self.first and a == b) or (self.first and b - a == 1)) else
                               1.0 if b > a else 0.5, "", 1))
        return out


def pairwise(model: RewardModel, **changes) -> ModelRewards:
    cfg = OmegaConf.create({"roles": ["solver"], "weight": 1.0, "program_weight": 0.0, "invalid": -0.5,
                            "max_calls": 0, "cache_size": 100, "agreement_threshold": 0.5, "pairwise": True,
                            "pairs": "all", "swap": True, **changes})
    parse = lambda text: text.rsplit("####", 1)[1].strip() if "####" in text else None  # noqa: E731
    return ModelRewards(cfg, model, parse, {"shared": TOKENIZER})


def test_pairwise_scores_are_shares_of_wins_within_a_group():
    model = Preferring()
    rows = [row("#### 1"), row("#### 3"), row("#### 2"), row("#### 3")]
    stats = pairwise(model).apply(rows)
    # distinct replies 1, 3, 2: 3 pairs × 2 orders; 3 beats both (1.0), 2 beats 1 (0.5), 1 none (0.0)
    assert [r.reward for r in rows] == [0.0, 1.0, 0.5, 1.0]
    assert stats["judge/calls"] == 6 and stats["judge/first_position_rate"] == 0.5
    assert stats["judge/swap_consistency"] == 1.0
    assert {(j.answer, j.rival_answer) for j in model.asked} == {("1", "3"), ("3", "1"), ("1", "2"), ("2", "1"),
                                                                 ("3", "2"), ("2", "3")}


def test_order_swapping_measures_and_cancels_a_position_bias():
    rows = [row("#### 1"), row("#### 2")]
    stats = pairwise(Preferring(first=True)).apply(rows)
    # the judge picks whichever is shown first when they differ by 1: (1, 2) → 1 wins, (2, 1) → 2 wins
    assert stats["judge/first_position_rate"] == 1.0 and stats["judge/swap_consistency"] == 0.0
    assert [r.reward for r in rows] == [0.5, 0.5]  # the bias cancels
    unswapped = [row("#### 1"), row("#### 2")]
    pairwise(Preferring(first=True), swap=False).apply(unswapped)
    assert [r.reward for r in unswapped] == [1.0, 0.0]  # shown first, the worse reply wins


def test_a_ring_compares_each_reply_with_the_next_and_groups_stay_apart():
    model = Preferring()
    rows = [row("#### 1"), row("#### 2"), row("#### 3"), row("#### 5", prompt="other"), row("#### 4", prompt="other")]
    for r, task in zip(rows, [0, 0, 0, 1, 1], strict=True):
        r.task = task
    stats = pairwise(model, pairs="ring", swap=False).apply(rows)
    # group 0, round the ring: (1, 2) 2 wins, (2, 3) 3 wins, (3, 1) 3 wins → 1: 0 of 2, 2: 1 of 2, 3: 2 of 2;
    # group 1 (two replies): one pair
    assert [r.reward for r in rows[:3]] == [0.0, 0.5, 1.0] and [r.reward for r in rows[3:]] == [1.0, 0.0]
    assert stats["judge/calls"] == 4


def test_a_reply_alone_in_its_group_is_uncompared():
    rows = [row("#### 4"), row("#### 4")]
    stats = pairwise(Preferring()).apply(rows)
    assert [r.reward for r in rows] == [0.5, 0.5] and stats["judge/uncompared"] == 1 and stats["judge/calls"] == 0
