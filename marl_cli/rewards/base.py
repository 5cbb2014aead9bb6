"""What a reward model is to the training loop: a scorer of (prompt, reply) pairs whose scores become the rewards of
the rows of the roles it covers, with its cache, its cap, its failures counted and its cost logged.

A reward model registers itself beside its class: ``@REWARDS.register(name, schema=..., check=...)`` (its settings
are the ``reward`` group's keys: ``reward=judge reward.roles=[agent]``); ``reward=none`` (the default) leaves every
reward as the workflow's program gave it. Each step, after the rollout and before the advantages,
``ModelRewards.apply`` scores the rows of ``reward.roles``:

    reward = weight · score + program_weight · program_reward          (score in [0, 1])

- every distinct (role, prompt, reply) is scored once; scores are cached across steps (``reward.cache_size``);
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
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import Registry
from marl_cli.config.schema import RewardConfig
from marl_cli.core.samples import Sample
from marl_cli.rewards.scores import Scale, check_template, render

DEFAULT_TEMPLATE = ("You grade an answer to a task.\nTask:\n{prompt}\nAnswer given: {answer}\n"
                    "Is the answer correct? End your reply with the line\n{verdict}\n")


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


@dataclass
class RubricConfig(RewardConfig):
    """What every judge that reads a rubric and writes a score shares (``reward=judge``, ``reward=http``)."""

    # the judge's prompt; fields: {prompt} {completion} {answer} {role} {verdict} {low} {high}
    template: str = DEFAULT_TEMPLATE
    templates: dict[str, str] = field(default_factory=dict)  # role -> its own rubric (else `template`)
    verdict: str = "Score: {score}"  # the line the judge ends with; {score} is where its number goes
    low: float = 0.0  # the lowest score the judge may write (maps to 0)
    high: float = 10.0  # the highest (maps to 1)


def check_rubric(cfg: Any) -> None:
    """The verdict line has its ``{score}`` slot, and every rubric a judged role reads is well formed."""
    reward = cfg.reward
    Scale(reward.verdict, reward.low, reward.high)
    check_template(reward.template, "reward.template")
    for role, template in reward.templates.items():
        if role not in cfg.workflow.roles:
            raise ConfigError(f"reward.templates has a rubric for {role!r}, which workflow={cfg.workflow.name} "
                              f"does not have (its roles: {', '.join(cfg.workflow.roles)})")
        check_template(template, f"reward.templates.{role}")


@dataclass(frozen=True)
class Judged:
    """One reply to score: the role that wrote it, the prompt it saw, the reply, the answer parsed from it."""

    role: str
    prompt: str
    completion: str
    answer: str | None


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


class RubricJudge(RewardModel):
    """A judge that reads a rubric and writes a score (``RubricConfig``): renders the prompts, parses the replies;
    a subclass says how replies are produced (``replies``)."""

    def __init__(self, cfg: Any, run: Any):
        super().__init__(cfg, run)
        reward = cfg.reward
        self.scale = Scale(reward.verdict, reward.low, reward.high)
        self.templates = dict(reward.templates)
        self.template = reward.template

    def prompt(self, item: Judged) -> str:
        return render(self.templates.get(item.role, self.template), self.scale, prompt=item.prompt,
                      completion=item.completion, answer=item.answer or "none", role=item.role)

    def score(self, items: list[Judged]) -> list[Verdict]:
        verdicts = []
        for reply, tokens in self.replies([self.prompt(item) for item in items]):
            if reply is None:
                verdicts.append(Verdict(None, "error", tokens))
                continue
            value, why = self.scale.parse(reply)
            verdicts.append(Verdict(value, why, tokens))
        return verdicts

    @abstractmethod
    def replies(self, prompts: list[str]) -> list[tuple[str | None, int]]:
        """The judge's reply to each prompt (None: no reply, a failed call) and the tokens it cost."""


class Rewarder(ABC):
    """What the loop holds: sets the rewards of a step's rows (``apply``), and saves and restores what it learned."""

    @abstractmethod
    def apply(self, rows: list[Sample]) -> dict[str, float]:
        """Set the rewards of the rows it covers, in place; the step's metrics."""

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
        self.cache: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def apply(self, rows: list[Sample]) -> dict[str, float]:
        """Score the rows of the covered roles and set their rewards; the step's judge metrics."""
        t0 = time.perf_counter()
        mine = judged_rows(rows, self.roles)
        if not mine:
            return {}
        keys = [self._key(row) for row in mine]
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

    def _key(self, row: Sample) -> tuple[str, str, str]:
        tokenizer = self.tokenizers[row.policy]
        return (row.role, tokenizer.decode(row.prompt_ids, skip_special_tokens=True),
                tokenizer.decode(row.completion_ids, skip_special_tokens=True))

    def _scores(self, keys: list[tuple[str, str, str]]) -> tuple[dict[tuple[str, str, str], float | None],
                                                                  dict[str, float]]:
        """The score of each distinct key: from the cache, or from the model (at most ``max_calls`` of them)."""
        scores: dict[tuple[str, str, str], float | None] = {}
        fresh = []
        for key in keys:
            if key in self.cache:
                self.cache.move_to_end(key)
                scores[key] = self.cache[key]
            else:
                fresh.append(key)
        cap = self.cfg.max_calls or len(fresh)
        asked, over = fresh[:cap], fresh[cap:]
        verdicts = self.model.score([Judged(role, prompt, reply, self.parse(reply)) for role, prompt, reply in asked])
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

    def _remember(self, key: tuple[str, str, str], score: float | None) -> None:
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
