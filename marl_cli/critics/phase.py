"""A run's learned value models (``critic=token|utterance``), in the loop: built when the policies are as RL found
them, scoring each step's rows before the algorithm's estimator (``annotate``), trained after the policies'
update (``update``), and saved in every checkpoint (weights, target copies, optimisers, replay buffers).

One critic per policy (its roles' rows) or one for the team (``critic.scope``). Its model is a copy of its
policy's model with a new value head, the model ``critic.model`` describes, or (``critic.share_trunk``) the head on
the policy's own model, whose weights the critic's update then moves too. Everything that depends on the algorithm
(the heads, a target copy, a replay buffer, value clipping, which values go on the rows and how the critic is
regressed) is the algorithm's ``ValueLearning`` (``algorithms/values.py``); this phase only runs it.
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from marl_cli.algorithms.base import ALGORITHMS
from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ModelConfig
from marl_cli.config.team import MODEL_KEYS, merged, policy_model
from marl_cli.core.samples import Sample
from marl_cli.core.world import World
from marl_cli.critics.critic import Critic
from marl_cli.critics.replay import ReplayBuffer
from marl_cli.critics.value_model import ValueModel, build_value_model
from marl_cli.policies.loading import load_tokenizer
from marl_cli.policies.regime import Policy


class CriticPhase:
    """The critics of a run.

    Args:
        cfg: the run config (``critic``, ``algorithm``, ``model``, ``policy.models``, ``seed``).
        world: the processes of the run; each holds every critic whole.
    """

    def __init__(self, cfg: DictConfig, world: World):
        self.cfg = cfg
        self.world = world
        values = ALGORITHMS.get(cfg.algorithm.name).values
        if values is None:
            raise ValueError(f"algorithm={cfg.algorithm.name} reads no critic")
        self.values = values
        self.critics: dict[str, Critic] = {}
        self.buffers: dict[str, ReplayBuffer] = {}
        self.shared: dict[str, Policy] = {}
        """The policies whose own trunk a critic trains (``critic.share_trunk``), by critic."""

    def check_tokenizers(self, policies: dict[str, Policy]) -> None:
        """A critic given its own model (``critic.model.name_or_path``) reads the policies' token ids, so its
        tokenizer must be theirs: a one-line ConfigError before any model is trained otherwise."""
        source = self.cfg.critic.model.get("name_or_path")
        if not source:
            return
        vocab = load_tokenizer(str(source)).get_vocab()
        for name, policy in policies.items():
            if policy.tokenizer.get_vocab() != vocab:
                raise ConfigError(f"critic.model.name_or_path={source}: its tokenizer differs from policy {name!r}'s "
                                  f"({policy.source}); the critic reads the policy's token ids")

    def owner(self, row: Sample) -> str:
        """The critic that scores ``row``: its policy's, or the team's."""
        return "team" if self.cfg.critic.scope == "team" else row.policy

    def build(self, policies: dict[str, Policy], run_dir: Path) -> None:
        """One critic per policy (or one for the team, from the first policy's model), each a copy of its policy's
        model as it is now (or ``critic.model`` over the policy's model config), with its value heads."""
        cfg = self.cfg
        names = ["team"] if cfg.critic.scope == "team" else list(policies)
        for name in names:
            policy = policies[next(iter(policies))] if name == "team" else policies[name]
            model = self._value_model(policy, name, run_dir)
            settings = cfg.critic if self.values.value_clip else OmegaConf.merge(cfg.critic, {"value_clip": None})
            self.critics[name] = Critic(model, settings, self.world, targets=self.values.target_copy)
            if self.values.replay:
                self.buffers[name] = ReplayBuffer(cfg.critic.replay_capacity)

    def _value_model(self, policy: Policy, name: str, run_dir: Path) -> ValueModel:
        """Critic ``name``'s model: its heads on the policy's own trunk (``critic.share_trunk``), on a copy of it,
        or on the model ``critic.model`` describes."""
        cfg, heads = self.cfg, self.values.heads
        if cfg.critic.share_trunk:
            self.shared[name] = policy
            pad = policy.model.config.pad_token_id
            return ValueModel(policy.model.get_decoder(), heads, cfg.seed, 0 if pad is None else int(pad))
        source = policy.model if not cfg.critic.model and policy.adapter is None else None
        model_cfg = None if source is not None else merged(policy_model(cfg, policy.name), cfg.critic.model,
                                                           ModelConfig, "critic.model", MODEL_KEYS)
        return build_value_model(source, model_cfg, heads, cfg.seed, run_dir, policy.model.device,
                                 f"_critic_{name}")

    def _groups(self, rows: list[Sample]) -> dict[str, list[Sample]]:
        groups: dict[str, list[Sample]] = defaultdict(list)
        for s in rows:
            groups[self.owner(s)].append(s)
        return groups

    def annotate(self, rows: list[Sample]) -> None:
        """Put each critic's values on its rows (the algorithm's ``ValueLearning.annotate``)."""
        for name, mine in self._groups(rows).items():
            self.values.annotate(self.critics[name], mine)

    def update(self, rows: list[Sample], step: int, rng: random.Random) -> dict[str, float]:
        """Train every critic on its rows of this step (the algorithm's ``ValueLearning.update``); its statistics as
        ``critic/<name>/<key>``."""
        out: dict[str, float] = {}
        for name, mine in self._groups(rows).items():
            stats = self.values.update(self.critics[name], self.buffers.get(name), mine, self.cfg, step, rng)
            if name in self.shared:  # the policy's weights moved: rollout backends with a copy re-sync
                self.shared[name].mark_updated()
            out.update({f"critic/{name}/{key}": value for key, value in stats.items()})
        return out

    def warming(self, step: int) -> bool:
        """Whether ``step`` is one of the critic's warm-up steps (``critic.warmup_steps``: the policies wait)."""
        return step <= self.cfg.critic.warmup_steps

    def state_dict(self) -> dict[str, Any]:
        """Every critic's state (weights, target copy, optimiser) and replay buffer."""
        return {name: {"critic": critic.state_dict(),
                       "buffer": self.buffers[name].state_dict() if name in self.buffers else None}
                for name, critic in self.critics.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict``'s state; a checkpoint without a critic this run has is a ValueError."""
        for name, critic in self.critics.items():
            if name not in state:
                raise ValueError(f"the checkpoint holds no state for critic {name!r} (it holds {sorted(state)})")
            critic.load_state_dict(state[name]["critic"])
            if name in self.buffers:
                self.buffers[name].load_state_dict(state[name]["buffer"])

