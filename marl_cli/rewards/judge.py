"""``reward=judge``: a generative judge, a causal LM that reads a rubric and writes a score.

The judge is either a policy of the run (``reward.policy=<name>``: its current weights, the rubric telling it that
it judges — the same model as the solver, role-conditioned, as in MAE), or a frozen model of its own
(``reward.model``: a local dir or hub id, e.g. a checkpoint's ``policies/<name>``; null ``name_or_path``: the tiny
model with its own seed, for dry runs). It generates through transformers (a run's policy: through the run's
rollout backend), greedily by default; its reply is parsed as ``core/verdicts.py`` says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ModelConfig, bounded
from marl_cli.rewards.base import REWARDS
from marl_cli.rewards.rubric import RubricConfig, RubricJudge, check_rubric


@dataclass
class JudgeConfig(RubricConfig):
    """A causal LM judge (``reward=judge``): one of the run's policies, or a frozen model."""

    policy: str | None = None  # a policy of the run that judges with its current weights; null: `model`, frozen
    model: ModelConfig = field(default_factory=ModelConfig)  # the frozen judge (name_or_path null: a tiny model)
    seed: int = 0  # the tiny judge's weights (when model.name_or_path is null)
    temperature: float = bounded(0.0, ge=0.0)  # 0: greedy
    max_new_tokens: int = bounded(16, ge=1)  # the judge's reply
    max_prompt_length: int = bounded(1024, ge=1)  # longer rubric prompts keep their end
    batch_size: int = bounded(64, ge=1)  # prompts per generate call


def check_judge(cfg: Any) -> None:
    """The rubric, and where the judge comes from: a policy the run has, or a model dir that exists."""
    from marl_cli.policies.roles import role_map

    check_rubric(cfg)
    reward = cfg.reward
    if reward.policy is not None:
        names = sorted(set(role_map(cfg).values()))
        if reward.policy not in names:
            raise ConfigError(f"reward.policy={reward.policy!r} is not a policy of this run; its policies: "
                              f"{', '.join(names)} (or leave it null to judge with reward.model, frozen)")
        return
    source = reward.model.name_or_path
    if source and str(source).startswith(("/", ".", "~")):
        path = Path(source).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"reward.model.name_or_path={source}: no model there (no config.json)")


@REWARDS.register("judge", schema=JudgeConfig, check=check_judge)
class GenerativeJudge(RubricJudge):
    """Replies from a causal LM: a policy of the run, or a frozen model loaded once."""

    def __init__(self, cfg: Any, run: Any):
        super().__init__(cfg, run)
        from marl_cli.rollout.generation import HFGenerator, Sampling

        reward = cfg.reward
        self.sampling = Sampling(temperature=reward.temperature, max_new_tokens=reward.max_new_tokens,
                                 max_prompt_length=reward.max_prompt_length, batch_size=reward.batch_size,
                                 use_chat_template=reward.model.use_chat_template)
        if reward.policy is not None:
            self.policy, self.generator = run.policies[reward.policy], run.generator
        else:
            self.policy, self.generator = frozen_judge(reward, run), HFGenerator()

    def replies(self, prompts: list[str]) -> list[tuple[str | None, int]]:
        if not prompts:
            return []
        generations = self.generator.generate(self.policy, prompts, self.sampling)
        return [(g.text, len(g.prompt_ids) + len(g.completion_ids)) for g in generations]


def frozen_judge(reward: Any, run: Any) -> Any:
    """The judge's own model, loaded once, on the device of the run's first policy, never trained."""
    import torch

    from marl_cli.policies.loading import load_model, load_tokenizer, resolve_source
    from marl_cli.policies.regime import Policy

    source = resolve_source(reward.model, reward.seed, Path(run.run_dir), "_judge")
    device = next((p.model.device for p in run.policies.values()), torch.device("cpu"))
    model = load_model(source, reward.model.dtype, device)
    model.requires_grad_(False)
    return Policy("judge", model, load_tokenizer(source), source, compute_dtype=model.dtype)
