"""What a reward model is to the training loop: a scorer of (prompt, reply) pairs whose scores become the rewards of
the rows of the roles it covers, with its cache, its cap, its failures counted and its cost logged.

A reward model registers itself beside its class: ``@REWARDS.register(name, schema=..., check=...)`` (its settings
are the ``reward`` group's keys: ``reward=judge reward.roles=[agent]``); ``reward=none`` (the default) leaves every
reward as the workflow's program gave it. Each step, after the rollout and before the advantages,
``ModelRewards.apply`` scores the rows of ``reward.roles``:

    reward = weight · score + program_weight · program_reward          (score in [0, 1])

- every distinct (role, prompt, reply) is scored once; scores are cached across steps (``reward.cache_size``);
  pairwise (``reward.pairwise``), a judgement is of two replies of one group and a reply's score its share of wins
  (``pairs_of``, ``position_bias``);
- at most ``reward.max_calls`` distinct pairs go to the model per step; a row beyond the cap gets ``reward.invalid``
  and is counted (``judge/over_cap``);
- a reply the model could not score (no verdict line, a number out of range, a failed call) gets ``reward.invalid``
  and is counted (``judge/parse_failures``, ``judge/out_of_range``, ``judge/errors``);
- the cost: ``time/judge_s``, ``judge/calls``, ``judge/tokens`` (the judge's prompt and reply tokens),
  ``judge/cache_hits`` (distinct pairs scored in an earlier step);
- the guard against reward hacking: where the program also knows the answer (every built-in env does: a row's
  ``success``), ``judge/agreement`` is the share of judged rows where "score ≥ ``reward.agreement_threshold``"
  equals the program's verdict. A judge reward that rises while agreement falls is a policy fooling its judge.

Each judged row keeps ``info["program_reward"]`` (its reward before) and ``info["judge_score"]`` (None-free: the
score it got, ``invalid`` included). Evaluations keep the program's success: a judge changes what trains, not what
is measured. This package imports nothing of ``training``; the loop hands it the run.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import Registry
from marl_cli.core.samples import Sample


def check_reward(cfg: Any) -> None:
    """Every reward model's rules: it covers at least one role, each a role of the workflow."""
    if cfg.reward.name == "none":
        return
    roles, mine = list(cfg.workflow.roles), list(cfg.reward.roles)
    if not mine:
        raise ConfigError(f"reward={cfg.reward.name} scores no role: name them, e.g. reward.roles=[{roles[0]}] "
                          f"(workflow={cfg.workflow.name} has {', '.join(roles)})")
    stray = [r for r in mine if r not in roles]
    if stray:
        raise ConfigError(f"reward.roles names {', '.join(stray)}, which workflow={cfg.workflow.name} does not have "
                          f"(its roles: {', '.join(roles)})")
    if cfg.reward.weight == 0 and cfg.reward.program_weight == 0:
        raise ConfigError("reward.weight and reward.program_weight are both 0: every judged row's reward would be 0")


REWARDS: Registry[Any] = Registry("reward.name", "reward", check=check_reward)
"""Reward models by name: a ``RewardModel`` class (scores replies; ``ModelRewards`` applies it), a ``Rewarder``
class (applies itself: a learned model that trains on the rows), or None (``none``)."""
REWARDS.register("none")(None)


@dataclass(frozen=True)
class Judged:
    """One reply to score: the role that wrote it, the prompt it saw, the reply, the answer parsed from it."""

    role: str
    prompt: str
    completion: str
    answer: str | None
    rival: str | None = None
    """Pairwise: the reply it is compared with, shown second."""
    rival_answer: str | None = None


@dataclass
class Verdict:
    """A reward model's score of one reply, in [0, 1] (None: none; ``failure`` says why: ``parse``, ``range`` or
    ``error``) and the tokens the judgement cost."""

    score: float | None
    failure: str = ""
    tokens: int = 0


class RewardModel(ABC):
    """Scores replies. Built once per run from the run config and the run (its policies, generator, workflow)."""

    def __init__(self, cfg: Any, run: Any):
        self.cfg = cfg

    @abstractmethod
    def score(self, items: list[Judged]) -> list[Verdict]:
        """One verdict per item, in order; a reply it cannot score gets ``Verdict(None, why)``, never an exception
        (an exception is a run-stopping error, stated in one line)."""


class Rewarder(ABC):
    """What the loop holds: sets the rewards of a step's rows (``apply``), and saves and restores what it learned."""

    @abstractmethod
    def apply(self, rows: list[Sample]) -> dict[str, float]:
        """Set the rewards of the rows it covers, in place; the step's metrics."""

    def warming(self, step: int) -> bool:
        """Whether ``step`` is one of the reward model's warm-up steps (it learns, the policies wait; none by
        default)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (a learned model's weights and optimiser; nothing by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict``'s state."""
        return

    def save(self, directory: Path) -> None:
        """Write what another run may load into ``directory`` (a checkpoint being written; nothing by default)."""
        return


def judged_rows(rows: list[Sample], roles: Any) -> list[Sample]:
    """The rows a reward model scores: of ``roles``, with tokens (a scripted role's rows have none)."""
    roles = set(roles)
    return [row for row in rows if row.role in roles and row.completion_ids]


def reply_group(row: Sample) -> tuple[int, int, str, int]:
    """The replies a reply is compared with (pairwise judges, Bradley–Terry pairs): one task, turn, role and segment."""
    return (row.task, row.turn, row.role, row.segment)


def agreement(scores: list[float], rows: list[Sample], threshold: float) -> dict[str, float]:
    """``judge/agreement``: the share of ``rows`` whose score's verdict (≥ ``threshold``) is the program's."""
    if not rows:
        return {}
    same = [(score >= threshold) == bool(row.success) for score, row in zip(scores, rows, strict=True)]
    return {"judge/agreement": sum(same) / len(same)}


def rewrite(row: Sample, score: float, reward: float) -> None:
    """Record the row's program reward and its score (``samples.jsonl`` shows both), and set its reward."""
    row.info["program_reward"] = row.reward
    row.info["judge_score"] = score
    row.reward = reward


Key = tuple[str, ...]
"""What a judgement is of: (role, prompt, reply), or pairwise (role, prompt, first reply, second reply)."""


def pairs_of(replies: list[Key], plan: str, swap: bool) -> list[tuple[Key, Key]]:
    """The comparisons among a group's distinct replies: each with the next, round the ring (``ring``; one pair for
    two replies), or every pair (``all``); with ``swap`` each pair also the other way round."""
    n = len(replies)
    if n < 2:
        return []
    if plan == "all" or n == 2:
        pairs = [(replies[i], replies[j]) for i in range(n) for j in range(i + 1, n)]
    else:
        pairs = [(replies[i], replies[(i + 1) % n]) for i in range(n)]
    return pairs + [(b, a) for a, b in pairs] if swap else pairs


def position_bias(comparisons: list[tuple[Key, Key]], asked: list[Key], verdicts: dict[Key, float | None]
                  ) -> dict[str, float]:
    """``judge/first_position_rate``: the share of decided comparisons won by the reply shown first (½ for a judge
    without position bias); ``judge/swap_consistency``: the share of pairs judged both ways whose two verdicts pick
    the same reply."""
    decided = [verdicts[k] < 0.5 for k in asked if verdicts[k] is not None and verdicts[k] != 0.5]
    out = {"judge/first_position_rate": sum(decided) / len(decided)} if decided else {}
    by_pair = {(a, b): verdicts[k] for (a, b), k in zip(comparisons, asked, strict=True)}
    both = [(v, by_pair[b, a]) for (a, b), v in by_pair.items() if (b, a) in by_pair and v is not None
            and by_pair[b, a] is not None and a < b]
    if both:
        out["judge/swap_consistency"] = sum((x < 0.5) == (y > 0.5) for x, y in both) / len(both)
    return out


class ModelRewards(Rewarder):
    """A reward model that scores replies applied to a run's rows (see the module's docstring).

    Args:
        cfg: the ``reward`` config.
        model: the reward model.
        parse: the workflow's answer parser (``Workflow.parse``).
        tokenizers: each policy's tokenizer by name (to read the rows' ids as text).
    """

    def __init__(self, cfg: Any, model: RewardModel, parse: Any, tokenizers: dict[str, Any]):
        self.cfg = cfg
        self.model = model
        self.parse = parse
        self.tokenizers = tokenizers
        self.roles = list(cfg.roles)
        self.cache: OrderedDict[Key, float | None] = OrderedDict()

    def apply(self, rows: list[Sample]) -> dict[str, float]:
        """Score the rows of the covered roles and set their rewards; the step's judge metrics."""
        t0 = time.perf_counter()
        mine = judged_rows(rows, self.roles)
        if not mine:
            return {}
        keys = [self._key(row) for row in mine]
        if self.cfg.get("pairwise"):
            scores, stats = self._pairwise(mine, keys)
        else:
            scores, stats = self._scores(list(dict.fromkeys(keys)))
        cfg = self.cfg
        scored = [(scores[key], row) for key, row in zip(keys, mine, strict=True) if scores[key] is not None]
        stats.update(agreement([s for s, _ in scored], [r for _, r in scored], cfg.agreement_threshold))
        for row, key in zip(mine, keys, strict=True):
            value = cfg.invalid if scores[key] is None else scores[key]
            rewrite(row, value, cfg.weight * value + cfg.program_weight * row.reward)
        stats["judge/score"] = sum(r.info["judge_score"] for r in mine) / len(mine)
        stats["time/judge_s"] = time.perf_counter() - t0
        return stats

    def _key(self, row: Sample) -> Key:
        tokenizer = self.tokenizers[row.policy]
        return (row.role, tokenizer.decode(row.prompt_ids, skip_special_tokens=True),
                tokenizer.decode(row.completion_ids, skip_special_tokens=True))

    def _pairwise(self, rows: list[Sample], keys: list[Key]) -> tuple[dict[Key, float | None], dict[str, float]]:
        """Each distinct reply's share of wins over the comparisons with the other replies of its group (task, turn,
        role, segment); ``swap`` judges each pair in both orders. A reply alone in its group scores ½; one whose
        every comparison failed, None."""
        groups: dict[tuple[int, int, str, int], list[Key]] = defaultdict(list)
        for row, key in zip(rows, keys, strict=True):
            groups[reply_group(row)].append(key)
        comparisons = [pair for members in groups.values() for pair in pairs_of(list(dict.fromkeys(members)),
                                                                                self.cfg.pairs, self.cfg.swap)]
        asked = [(a[0], a[1], a[2], b[2]) for a, b in comparisons]
        verdicts, stats = self._scores(list(dict.fromkeys(asked)))
        wins: dict[Key, list[float]] = defaultdict(list)
        for (a, b), key in zip(comparisons, asked, strict=True):
            if verdicts[key] is not None:  # 0: the first reply is better, 1: the second
                wins[a].append(1.0 - verdicts[key])
                wins[b].append(verdicts[key])
        stats.update(position_bias(comparisons, asked, verdicts))
        alone = {key for members in groups.values() if len(set(members)) == 1 for key in members}
        stats["judge/uncompared"] = float(len(alone))  # distinct replies with none to compare against
        scores = {key: 0.5 if key in alone else sum(wins[key]) / len(wins[key]) if wins[key] else None
                  for key in dict.fromkeys(keys)}
        return scores, stats

    def _scores(self, keys: list[Key]) -> tuple[dict[Key, float | None], dict[str, float]]:
        """The score of each distinct key: from the cache, or from the model (at most ``max_calls`` of them)."""
        scores: dict[Key, float | None] = {}
        fresh = []
        for key in keys:
            if key in self.cache:
                self.cache.move_to_end(key)
                scores[key] = self.cache[key]
            else:
                fresh.append(key)
        cap = self.cfg.max_calls or len(fresh)
        asked, over = fresh[:cap], fresh[cap:]
        verdicts = self.model.score([self._judged(key) for key in asked])
        stats = {"judge/calls": float(len(asked)), "judge/over_cap": float(len(over)),
                 "judge/tokens": float(sum(v.tokens for v in verdicts)),
                 "judge/cache_hits": float(len(keys) - len(fresh))}
        for why, name in (("parse", "parse_failures"), ("range", "out_of_range"), ("error", "errors")):
            stats[f"judge/{name}"] = float(sum(v.failure == why for v in verdicts))
        for key, verdict in zip(asked, verdicts, strict=True):
            scores[key] = verdict.score
            if verdict.failure != "error":  # a failed call may succeed next time; a judge's reply stands
                self._remember(key, verdict.score)
        for key in over:
            scores[key] = None
        return scores, stats

    def _judged(self, key: Key) -> Judged:
        """What the model scores for a key: (role, prompt, reply) or, pairwise, (role, prompt, first, second)."""
        role, prompt, reply, *rival = key
        second = rival[0] if rival else None
        return Judged(role, prompt, reply, self.parse(reply), second, None if second is None else self.parse(second))

    def _remember(self, key: Key, score: float | None) -> None:
        if self.cfg.cache_size == 0:
            return
        self.cache[key] = score
        while len(self.cache) > self.cfg.cache_size:
            self.cache.popitem(last=False)


def build_rewards(cfg: Any, run: Any) -> Rewarder | None:
    """The run's reward model over its rows (None under ``reward=none``)."""
    reward = cfg.get("reward")  # a run saved before rewards from models had none
    kind = None if reward is None else REWARDS.get(reward.name)
    if kind is None:
        return None
    if issubclass(kind, Rewarder):
        return kind(cfg, run)
    return ModelRewards(cfg.reward, kind(cfg, run), run.workflow.parse, run.tokenizers())
