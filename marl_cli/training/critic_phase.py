"""A run's learned value models (``critic=token|utterance``), in the loop: built when the policies are as RL found
them, scoring each step's rows before the algorithm's estimator (``annotate``), trained after the policies'
update (``update``), and saved in every checkpoint (weights, target copies, optimisers, replay buffers).

One critic per policy (its roles' rows) or one for the team (``critic.scope``). Its model is a copy of its
policy's model with a new value head, the model ``critic.model`` describes, or (``critic.share_trunk``) the head on
the policy's own model, whose weights the critic's update then moves too. What it is regressed to is the
algorithm's:

- ``ppo`` (token level) and ``marft`` (utterance level): this step's GAE returns (``Sample.returns``), PPO's
  clipped value loss around the values the rows were scored with, ``critic.epochs`` passes;
- ``archer`` (utterance level, four heads: V1, V2, Q1, Q2, and a target copy): the step's turns join a replay
  buffer as transitions (s, a, r, s′ = the role's next prompt in its episode, done after its last turn); each of
  ``critic.updates_per_step`` updates draws ``critic.replay_batch_size`` of them and regresses
  Q_i(s, a) → r + γ·(1 − done)·V̄_i(s′) and V_i(s) → Q̄_i(s, a), then moves the target copy by τ. ArCHer's code
  takes the V target at a fresh action of the current policy; marl takes the stored action, which needs no
  generation in the critic's update (V then tracks the value of the actions the buffer holds).
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from marl_cli.algorithms.critics import CRITICS
from marl_cli.algorithms.gae import role_keys, turn_order
from marl_cli.algorithms.td import critic_targets
from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ModelConfig
from marl_cli.config.team import MODEL_KEYS, merged, policy_model
from marl_cli.critics.critic import Critic, CriticBatch, Regression, prompt_only
from marl_cli.critics.replay import ReplayBuffer, Transition
from marl_cli.critics.value_model import ValueModel, build_value_model
from marl_cli.policies.loading import load_tokenizer
from marl_cli.policies.regime import Policy
from marl_cli.rollout.samples import Sample
from marl_cli.training.distributed import World

V1, V2, Q1, Q2 = range(4)
"""ArCHer's heads of the utterance critic."""


class CriticPhase:
    """The critics of a run.

    Args:
        cfg: the run config (``critic``, ``algorithm``, ``model``, ``policy.models``, ``seed``).
        world: the processes of the run; each holds every critic whole.
    """

    def __init__(self, cfg: DictConfig, world: World):
        self.cfg = cfg
        self.world = world
        self.level = CRITICS.get(cfg.critic.name).level
        self.archer = cfg.algorithm.name == "archer"
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
            settings = OmegaConf.merge(cfg.critic, {"value_clip": None}) if self.archer else cfg.critic  # plain MSE
            self.critics[name] = Critic(model, settings, self.world, targets=self.archer)
            if self.archer:
                self.buffers[name] = ReplayBuffer(cfg.critic.replay_capacity)

    def _value_model(self, policy: Policy, name: str, run_dir: Path) -> ValueModel:
        """Critic ``name``'s model: its heads on the policy's own trunk (``critic.share_trunk``), on a copy of it,
        or on the model ``critic.model`` describes."""
        cfg, heads = self.cfg, 4 if self.archer else 1
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
        """Put each critic's values on its rows: ``values`` per token (token level), ``value`` (and ArCHer's
        ``q_value``: the minimum of the two heads, as its actor reads them) per row."""
        for name, mine in self._groups(rows).items():
            critic = self.critics[name]
            if self.level == "token":
                for s, values in zip(mine, critic.token_values(mine), strict=True):
                    s.values = values
                continue
            states = critic.state_values(mine)
            if not self.archer:
                for s, v in zip(mine, states[:, 0].tolist(), strict=True):
                    s.value = v
                continue
            actions = critic.action_values(mine)
            low_v, low_q = torch.minimum(states[:, V1], states[:, V2]), torch.minimum(actions[:, Q1], actions[:, Q2])
            for s, v, q in zip(mine, low_v.tolist(), low_q.tolist(), strict=True):
                s.value, s.q_value = v, q

    def update(self, rows: list[Sample], step: int, rng: random.Random) -> dict[str, float]:
        """Train every critic on its rows of this step; its statistics as ``critic/<name>/<key>``."""
        out: dict[str, float] = {}
        for name, mine in self._groups(rows).items():
            stats = self._archer(name, mine, step, rng) if self.archer else self._on_policy(name, mine, rng)
            if name in self.shared:  # the policy's weights moved: rollout backends with a copy re-sync
                self.shared[name].mark_updated()
            out.update({f"critic/{name}/{key}": value for key, value in stats.items()})
        return out

    def _on_policy(self, name: str, rows: list[Sample], rng: random.Random) -> dict[str, float]:
        """PPO's and MARFT's regression of the values to this step's returns, clipped around the rows' values."""
        if self.level == "token":
            regression = Regression("token", [s.returns for s in rows], old_values=[s.values for s in rows])
        else:  # the state's value reads the prompt only
            regression = Regression("state", torch.tensor([s.returns[0] for s in rows], dtype=torch.float64),
                                    old_values=torch.tensor([s.value for s in rows], dtype=torch.float64))
            return self.critics[name].update(CriticBatch([prompt_only(s) for s in rows], [regression]), rng)
        return self.critics[name].update(CriticBatch(rows, [regression]), rng)

    def _archer(self, name: str, rows: list[Sample], step: int, rng: random.Random) -> dict[str, float]:
        """ArCHer's off-policy updates from the replay buffer (the module's docstring), then the buffer's size and
        the age of what the updates drew."""
        critic, buffer = self.critics[name], self.buffers[name]
        buffer.add(transitions(rows, step))
        stats: dict[str, list[float]] = defaultdict(list)
        drawn: list[Transition] = []
        for _ in range(self.cfg.critic.updates_per_step):
            batch = buffer.sample(self.cfg.critic.replay_batch_size, rng)
            drawn += batch
            for key, value in critic.update(self._td_batch(critic, batch), rng).items():
                stats[key].append(value)
            critic.soft_update()
        out = {key: sum(values) / len(values) for key, values in stats.items()}
        out.update({f"replay/{key}": value for key, value in buffer.ages(step, drawn).items()})
        out["replay/size"] = float(len(buffer))
        out["replay/off_policy_fraction"] = sum(t.step < step for t in drawn) / max(len(drawn), 1)
        return out

    def _td_batch(self, critic: Critic, batch: list[Transition]) -> CriticBatch:
        """The regression of ArCHer's four heads on ``batch``, its targets from the target copy."""
        rewards = torch.tensor([t.reward for t in batch], dtype=torch.float64)
        dones = torch.tensor([t.done for t in batch])
        following = critic.next_state_values(batch, target=True).double()
        here = critic.action_values(batch, target=True).double()
        targets = critic_targets(rewards, dones, (following[:, V1], following[:, V2]), (here[:, Q1], here[:, Q2]),
                                 self.cfg.algorithm.gamma)
        return CriticBatch(batch, [Regression("action", torch.stack([targets.q1, targets.q2], 1), heads=(Q1, Q2)),
                                   Regression("state", torch.stack([targets.v1, targets.v2], 1), heads=(V1, V2))])

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


def transitions(rows: list[Sample], step: int) -> list[Transition]:
    """Each row as a transition: its prompt and completion, its reward, and the prompt of its role's next turn in
    the episode (``turn_order``), or done after its last turn (the episode ended, or hit its turn limit)."""
    following = turn_order(role_keys(rows)).tolist()
    return [Transition(list(s.prompt_ids), list(s.completion_ids), s.reward, j < 0,
                       None if j < 0 else list(rows[j].prompt_ids), step, s.role)
            for s, j in zip(rows, following, strict=True)]
