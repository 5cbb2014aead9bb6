"""Judges that read a rubric and write a score: the settings they share (``RubricConfig``: the rubric templates, the
verdict line and its range, pairwise comparison), their checks, and ``RubricJudge``, which renders each reply's
rubric and parses the judge's verdict (``core.verdicts.Scale``); a subclass says how the judge's replies are produced (a
model of the run, ``judge.py``; a server, ``http.py``)."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import RewardConfig, choices
from marl_cli.core.verdicts import Scale, check_template, check_verdict, render
from marl_cli.rewards.base import Judged, RewardModel, Verdict

DEFAULT_TEMPLATE = ("You grade an answer to a task.\nTask:\n{prompt}\nAnswer given: {answer}\n"
                    "Is the answer correct? End your reply with the line\n{verdict}\n")
DEFAULT_PAIR_TEMPLATE = ("Two answers to one task.\nTask:\n{prompt}\nAnswer 1: {answer_a}\nAnswer 2: {answer_b}\n"
                         "Which answer is better (1 or 2)? End your reply with the line\n{verdict}\n")
PairPlan = choices("PairPlan", "ring", "all", module=__name__)


@dataclass
class RubricConfig(RewardConfig):
    """What every judge that reads a rubric and writes a score shares (``reward=judge``, ``reward=http``)."""

    # the judge's prompt; fields: {prompt} {completion} {answer} {role} {verdict} {low} {high}
    template: str = DEFAULT_TEMPLATE
    templates: dict[str, str] = field(default_factory=dict)  # role -> its own rubric (else `template`)
    verdict: str = "Score: {score}"  # the line the judge ends with; {score} is where its number goes
    low: float = 0.0  # the lowest score the judge may write (maps to 0)
    high: float = 10.0  # the highest (maps to 1)
    pairwise: bool = False  # compare the replies of a group two by two; a reply's score is its share of wins
    pairs: PairPlan = PairPlan.ring  # pairwise: which pairs of a group's distinct replies (ring: n, all: n(n-1)/2)
    swap: bool = True  # pairwise: judge every pair in both orders (position bias cancels; its size is logged)
    # pairwise: the judge's prompt; fields {prompt} {answer_a} {answer_b} {completion_a} {completion_b} {role} {verdict}
    pair_template: str = DEFAULT_PAIR_TEMPLATE
    pair_verdict: str = "Better: {score}"  # pairwise: the line the judge ends with, 1 (the first) or 2 (the second)


def check_rubric(cfg: Any) -> None:
    """The verdict line has its ``{score}`` slot, and every rubric a judged role reads is well formed."""
    reward = cfg.reward
    Scale(reward.verdict, reward.low, reward.high)
    check_template(reward.template, "reward.template")
    if reward.pairwise:
        check_verdict(reward.pair_verdict, "reward.pair_verdict")
        check_template(reward.pair_template, "reward.pair_template", pairwise=True)
    for role, template in reward.templates.items():
        if role not in cfg.workflow.roles:
            raise ConfigError(f"reward.templates has a rubric for {role!r}, which workflow={cfg.workflow.name} "
                              f"does not have (its roles: {', '.join(cfg.workflow.roles)})")
        check_template(template, f"reward.templates.{role}")


class RubricJudge(RewardModel):
    """A judge that reads a rubric and writes a score (``RubricConfig``): renders the prompts, parses the replies;
    a subclass says how replies are produced (``replies``)."""

    def __init__(self, cfg: Any, run: Any):
        super().__init__(cfg, run)
        reward = cfg.reward
        self.scale = Scale(reward.verdict, reward.low, reward.high)
        self.templates = dict(reward.templates)
        self.template = reward.template
        self.pair_scale = Scale(reward.pair_verdict, 1, 2) if reward.pairwise else None
        self.pair_template = reward.pair_template

    def prompt(self, item: Judged) -> str:
        if item.rival is not None:
            return render(self.pair_template, self.pair_scale, prompt=item.prompt, role=item.role,
                          completion_a=item.completion, answer_a=item.answer or "none", completion_b=item.rival,
                          answer_b=item.rival_answer or "none")
        return render(self.templates.get(item.role, self.template), self.scale, prompt=item.prompt,
                      completion=item.completion, answer=item.answer or "none", role=item.role)

    def score(self, items: list[Judged]) -> list[Verdict]:
        verdicts = []
        for item, (reply, tokens) in zip(items, self.replies([self.prompt(item) for item in items]), strict=True):
            if reply is None:
                verdicts.append(Verdict(None, "error", tokens))
                continue
            value, why = (self.scale if item.rival is None else self.pair_scale).parse(reply)
            verdicts.append(Verdict(value, why, tokens))
        return verdicts

    @abstractmethod
    def replies(self, prompts: list[str]) -> list[tuple[str | None, int]]:
        """The judge's reply to each prompt (None: no reply, a failed call) and the tokens it cost."""
