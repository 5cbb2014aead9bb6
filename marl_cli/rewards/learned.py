"""Learned reward models: a trunk and a scalar head (the critics' ``ValueModel``), read at a row's last completion
token, trained on the run's own rows as they come, saved in every checkpoint, and loadable by another run.

``reward=scalar`` — a scalar reward model r(x) of each reply x (prompt and completion). It scores a step's rows,
*then* learns from them (a row's reward never comes from a model that has seen its label), by
``objective=regression`` toward the program's label y (``label=success``: 1 if the row's action solved the task;
``label=reward``: its program reward), or ``objective=bradley_terry`` on the pairs of a group (the K replies of one
task, turn and role) whose labels differ, the better one preferred (``rewards/losses.py``). Its score is r(x)
(regression) or σ(r(x)) (Bradley–Terry).

``reward=progress`` — SPA-RL's progress estimator (arXiv 2505.20732): the contribution c_t of each step t of a
role's episode is r(x_t) at its last token; it learns *first* from the step's episodes, ``(Σ_t c_t − R)²`` with R the
episode's outcome (``outcome=success``: 1 if the role's episode solved the task; ``return``: the sum of its program
rewards), then gives each step ``weight · c_t + validity · g_t (+ program_weight · its program reward)``, g_t = 1 when
the step's action parsed (``format_ok``). SPA's code trains the estimator on the SFT policy's exploration rollouts
and annotates those same rollouts for PPO; here both happen each step on the step's rollouts. Its code reads the
head from the LM's vocabulary logits at the turn's last token; a head on the hidden state (ours) holds every such
function (the logits are a linear map of it). Its released ``rl_data_org.py`` then replaces every turn's value with
the episode's outcome minus the mean outcome of the other episodes of the task — per-turn attribution off; marl keeps
the paper's c_t. Where the env reports how far a state is from done (``info["distance"]``: Plan-Path's BFS distance
to the goal after the step), ``progress/distance_corr`` is the Pearson correlation of the predicted remaining
progress 1 − Σ_{k≤t} c_k with it.

``reward.path``: start from a saved model (a run dir, a checkpoint dir, or the ``reward_model.safetensors`` a
checkpoint holds); its shape is checked against the configured model before any model is built.
"""

from __future__ import annotations

import json
import math
import random
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ModelConfig, RewardConfig, bounded, check_warmup, choices
from marl_cli.config.team import MODEL_KEYS, merged, policy_model
from marl_cli.core.samples import Sample
from marl_cli.rewards.base import REWARDS, Rewarder, agreement, judged_rows, reply_group, rewrite

FILE = "reward_model.safetensors"
"""The learned reward model's weights in a checkpoint (trunk and head)."""
HEAD = "head.weight"
Objective = choices("Objective", "regression", "bradley_terry", module=__name__)
Label = choices("Label", "success", "reward", module=__name__)
Outcome = choices("Outcome", "success", "return", module=__name__)


@dataclass
class LearnedConfig(RewardConfig):
    """What every learned reward model shares: its model, where it starts from, and its optimiser."""

    # what its model changes from the scored role's policy model (name_or_path, tiny.*, dtype: as policy.models);
    # empty: a copy of that policy's model as RL found it, a new scalar head on its trunk
    model: dict[str, Any] = field(default_factory=dict)
    path: str | None = None  # start from a saved reward model: a run dir, a checkpoint dir or its reward_model file
    train: bool = True  # learn from each step's rows; false: frozen (a loaded one)
    learning_rate: float = bounded(1e-4, gt=0.0)  # AdamW
    weight_decay: float = bounded(0.0, ge=0.0)  # AdamW weight decay
    max_grad_norm: float = bounded(1.0, ge=0.0)  # 0: no clipping
    mini_batch_size: int = bounded(32, ge=1)  # rows (scalar), pairs (bradley_terry) or episodes (progress) a step
    epochs: int = bounded(1, ge=1)  # passes over each step's rows
    warmup_steps: int = bounded(0, ge=0)  # the first N steps train the reward model only (the policies wait)


@dataclass
class ScalarConfig(LearnedConfig):
    """A scalar reward model of each reply (``reward=scalar``)."""

    objective: Objective = Objective.regression  # regression toward the label, or Bradley–Terry on a group's pairs
    label: Label = Label.success  # what it learns: the program's verdict (1/0), or its reward


@dataclass
class ProgressConfig(LearnedConfig):
    """SPA-RL's progress estimator (``reward=progress``): per-step contributions that add up to the outcome."""

    validity: float = 0.5  # β in r_t = weight·c_t + β·g_t (SPA's code: 0.5 for an action the env could carry out)
    outcome: Outcome = Outcome.success  # R: the role's episode solved the task (1/0), or the sum of its rewards


def saved_file(path: str) -> Path:
    """The weights file ``reward.path`` names: the file, a checkpoint's, or a run's latest checkpoint's."""
    target = Path(path).expanduser()
    if target.is_file():
        return target
    if (target / FILE).is_file():
        return target / FILE
    steps = sorted((target / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[-1]) if
                   p.name.split("_")[-1].isdigit() else -1)
    found = [p / FILE for p in steps if (p / FILE).is_file()]
    if not found:
        raise ConfigError(f"reward.path={path}: no saved reward model there ({FILE} in it, a checkpoint or a run)")
    return found[-1]


def tensor_shapes(file: Path) -> dict[str, list[int]]:
    """The shape of every tensor of a safetensors file, from its header (no tensor is read)."""
    with file.open("rb") as handle:
        size = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(size))
    return {name: info["shape"] for name, info in header.items() if name != "__metadata__"}


def model_width(model_cfg: Any) -> int | None:
    """The hidden size a model config builds (a local model's ``config.json``; None for a hub id)."""
    if not model_cfg.name_or_path:
        return int(model_cfg.tiny.hidden_size)
    config = Path(str(model_cfg.name_or_path)).expanduser() / "config.json"
    return json.loads(config.read_text()).get("hidden_size") if config.is_file() else None


def estimator_model(cfg: Any, policy_name: str) -> Any:
    """The model config the estimator is built from: the scored role's policy model, ``reward.model`` over it."""
    return merged(policy_model(cfg, policy_name), cfg.reward.model, ModelConfig, "reward.model", MODEL_KEYS)


def check_learned(cfg: Any) -> None:
    """``reward.model`` changes only model keys; a saved model's head fits the configured model's width."""
    from marl_cli.policies.roles import role_map

    reward = cfg.reward
    if reward.warmup_steps and not reward.train:
        raise ConfigError(f"reward.warmup_steps={reward.warmup_steps}: a frozen reward model (reward.train=false) "
                          "does not learn; set warmup_steps=0")
    check_warmup("reward.warmup_steps", reward.warmup_steps, cfg.trainer.steps)
    policy = role_map(cfg)[reward.roles[0]]
    model_cfg = estimator_model(cfg, policy)
    if cfg.reward.path is None:
        return
    file = saved_file(cfg.reward.path)
    shape, width = tensor_shapes(file).get(HEAD), model_width(model_cfg)
    if shape is None:
        raise ConfigError(f"reward.path={cfg.reward.path}: {file} holds no {HEAD}: not a marl reward model")
    if shape[0] != 1 or (width is not None and shape[1] != width):
        raise ConfigError(f"reward.path={cfg.reward.path}: its head is {shape[0]}×{shape[1]} but the reward model "
                          f"here is 1×{width} (a scalar head on a model of width {width}: reward.model, or the "
                          f"policy's model); train it with the same model")


class LearnedRewards(Rewarder):
    """A ``ValueModel`` with one head and its AdamW optimiser, scoring rows at their last completion token."""

    def __init__(self, cfg: Any, run: Any):
        import torch

        reward = self.cfg = cfg.reward
        self.roles = list(reward.roles)
        name = run.routing[self.roles[0]]
        self.model = self._build(cfg, run.policies[name], Path(run.run_dir))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=reward.learning_rate,
                                           weight_decay=reward.weight_decay)
        self.rng = random.Random(cfg.seed)

    def _build(self, cfg: Any, policy: Any, run_dir: Path) -> Any:
        from marl_cli.critics.value_model import build_value_model
        from marl_cli.policies.loading import load_tokenizer

        reward, device = cfg.reward, policy.model.device
        source = reward.model.get("name_or_path")
        if source and load_tokenizer(str(source)).get_vocab() != policy.tokenizer.get_vocab():
            raise ConfigError(f"reward.model.name_or_path={source}: its tokenizer differs from policy "
                              f"{policy.name!r}'s ({policy.source}); the reward model reads the policy's token ids")
        copy = not reward.model and policy.adapter is None
        model = build_value_model(policy.model if copy else None, None if copy else estimator_model(cfg, policy.name),
                                  1, cfg.seed, run_dir, device, "_reward")
        if reward.path is not None:
            from safetensors.torch import load_file

            try:
                model.load_state_dict(load_file(str(saved_file(reward.path)), device=str(device)))
            except RuntimeError as exc:
                raise ConfigError(f"reward.path={reward.path}: does not fit the reward model here: "
                                  f"{str(exc).splitlines()[1].strip()}") from exc
        return model

    def warming(self, step: int) -> bool:
        return self.cfg.train and step <= self.cfg.warmup_steps

    def values(self, rows: list[Sample], grad: bool = False) -> Any:
        """r(x) of each row at its last completion token, (N,); batches of ``mini_batch_size`` without grad."""
        import torch

        from marl_cli.critics.critic import positions, row_values

        if grad:
            return torch.cat(row_values(self.model, rows, [positions(r, "action") for r in rows]))[:, 0]
        self.model.eval()
        with torch.no_grad():
            size = self.cfg.mini_batch_size
            parts = [self.values(rows[i:i + size], grad=True) for i in range(0, len(rows), size)]
        return torch.cat(parts).float().cpu() if parts else torch.zeros(0)

    def step(self, loss: Any) -> None:
        """One optimiser step on ``loss``."""
        import torch

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.setstate(state["rng"])

    def save(self, directory: Path) -> None:
        """The weights as ``reward_model.safetensors`` in ``directory`` (a checkpoint being written)."""
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()},
                  str(directory / FILE))

    def batches(self, items: list[Any]) -> list[list[Any]]:
        """``epochs`` shuffled passes over ``items`` in mini-batches (this model's own RNG: resumed exactly)."""
        out = []
        for _ in range(self.cfg.epochs):
            order = list(items)
            self.rng.shuffle(order)
            size = self.cfg.mini_batch_size
            out += [order[i:i + size] for i in range(0, len(order), size)]
        return out


def label(row: Sample, kind: str) -> float:
    """What the scalar model learns of a row: the program's verdict (1/0) or its reward."""
    return float(row.success) if kind == "success" else float(row.info.get("program_reward", row.reward))


@REWARDS.register("scalar", schema=ScalarConfig, check=check_learned)
class ScalarRewards(LearnedRewards):
    """A scalar reward model scoring each reply, then learning from the step's labels (the module's docstring)."""

    def apply(self, rows: list[Sample]) -> dict[str, float]:
        import torch

        mine = judged_rows(rows, self.roles)
        if not mine:
            return {}
        cfg, bt = self.cfg, self.cfg.objective == "bradley_terry"
        raw = self.values(mine)
        scores = (torch.sigmoid(raw) if bt else raw).tolist()
        labels = [label(row, cfg.label) for row in mine]
        stats = agreement(scores, mine, cfg.agreement_threshold)
        for row, score in zip(mine, scores, strict=True):
            rewrite(row, score, cfg.weight * score + cfg.program_weight * row.reward)
        stats["judge/score"] = sum(scores) / len(scores)
        if cfg.train:
            stats.update(self.learn(mine, labels))
        return stats

    def learn(self, rows: list[Sample], labels: list[float]) -> dict[str, float]:
        """One pass (``epochs``) of the objective over the step's rows; the mean loss."""
        import torch

        from marl_cli.rewards.losses import bradley_terry_loss, regression_loss

        if self.cfg.objective == "bradley_terry":
            items = preference_pairs(rows, labels)
            if not items:
                return {"reward_model/pairs": 0.0}
        else:
            items = list(range(len(rows)))
        losses = []
        for batch in self.batches(items):
            if self.cfg.objective == "bradley_terry":
                values = self.values([rows[i] for pair in batch for i in pair], grad=True).view(-1, 2)
                loss = bradley_terry_loss(values[:, 0], values[:, 1])
            else:
                values = self.values([rows[i] for i in batch], grad=True)
                loss = regression_loss(values, torch.tensor([labels[i] for i in batch]))
            self.step(loss)
            losses.append(float(loss.detach()))
        stats = {"reward_model/loss": sum(losses) / len(losses)}
        if self.cfg.objective == "bradley_terry":
            stats["reward_model/pairs"] = float(len(items))
        return stats


def preference_pairs(rows: list[Sample], labels: list[float]) -> list[tuple[int, int]]:
    """(better, worse) row indices of every pair in a group (task, turn, role, segment) whose labels differ."""
    groups: dict[tuple[int, int, str, int], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[reply_group(row)].append(i)
    pairs = []
    for members in groups.values():
        for a in members:
            pairs += [(a, b) for b in members if labels[a] > labels[b]]
    return pairs


def check_progress(cfg: Any) -> None:
    """The estimator splits each episode's outcome over its steps: episodes, not tree candidates."""
    if cfg.algorithm.mode == "tree":
        raise ConfigError("reward=progress splits each episode's outcome over its steps; tree rollouts have no "
                          "episode per row: use algorithm.mode=independent")
    check_learned(cfg)


@REWARDS.register("progress", schema=ProgressConfig, check=check_progress)
class ProgressRewards(LearnedRewards):
    """SPA-RL's progress estimator: learns per-step contributions, then pays them as step rewards."""

    def apply(self, rows: list[Sample]) -> dict[str, float]:
        import torch

        from marl_cli.rewards.losses import progress_loss, progress_rewards

        cfg = self.cfg
        episodes = role_episodes(judged_rows(rows, self.roles))
        if not episodes:
            return {}
        outcomes = [outcome(rows_of, cfg.outcome) for rows_of in episodes]
        flat = [row for rows_of in episodes for row in rows_of]
        before = self.contributions(episodes)
        stats = {"progress/loss_before": _mse(before, outcomes)}
        if cfg.train:
            for batch in self.batches(list(range(len(episodes)))):
                values = self.values([row for e in batch for row in episodes[e]], grad=True)
                parts = list(torch.split(values, [len(episodes[e]) for e in batch]))
                self.step(progress_loss(parts, torch.tensor([outcomes[e] for e in batch])))
        after = self.contributions(episodes)
        stats["progress/loss"] = _mse(after, outcomes)
        for rows_of, contributions in zip(episodes, after, strict=True):
            rewards = progress_rewards(contributions, [r.format_ok for r in rows_of], cfg.weight, cfg.validity)
            for row, c, r in zip(rows_of, contributions, rewards, strict=True):
                rewrite(row, c, r + cfg.program_weight * row.reward)
        stats["progress/contribution"] = sum(r.info["judge_score"] for r in flat) / len(flat)
        stats.update(distance_correlation(episodes, after))
        return stats

    def contributions(self, episodes: list[list[Sample]]) -> list[list[float]]:
        values = self.values([row for rows_of in episodes for row in rows_of]).tolist()
        out, start = [], 0
        for rows_of in episodes:
            out.append(values[start:start + len(rows_of)])
            start += len(rows_of)
        return out


def role_episodes(rows: list[Sample]) -> list[list[Sample]]:
    """Each role's rows of each episode (``algorithms.grpo.role_episodes``), in turn order, episodes by (task,
    branch, role, segment)."""
    from marl_cli.algorithms.grpo import role_episodes as indices

    episodes = [[rows[i] for i in idx] for idx in indices(rows)]
    return sorted(episodes, key=lambda e: (e[0].task, e[0].branch, e[0].role, e[0].segment))


def outcome(rows: list[Sample], kind: str) -> float:
    """R of a role's episode: 1 if one of its actions solved the task (``success``), or the sum of its rewards."""
    if kind == "success":
        return float(any(r.success for r in rows))
    return float(sum(r.info.get("program_reward", r.reward) for r in rows))


def _mse(contributions: list[list[float]], outcomes: list[float]) -> float:
    """``progress_loss`` of plain numbers (the step's loss before and after its fit, for the log)."""
    import torch

    from marl_cli.rewards.losses import progress_loss

    parts = [torch.tensor(c, dtype=torch.float64) for c in contributions]
    return float(progress_loss(parts, torch.tensor(outcomes, dtype=torch.float64)))


def distance_correlation(episodes: list[list[Sample]], contributions: list[list[float]]) -> dict[str, float]:
    """``progress/distance_corr``: Pearson's r between the predicted remaining progress after each step,
    1 − Σ_{k≤t} c_k, and the env's distance to done after it (``info["distance"]``), over the steps that have one."""
    pairs = []
    for rows_of, cs in zip(episodes, contributions, strict=True):
        done = 0.0
        for row, c in zip(rows_of, cs, strict=True):
            done += c
            if "distance" in row.info:
                pairs.append((1.0 - done, float(row.info["distance"])))
    if len(pairs) < 2:
        return {}
    r = pearson([p for p, _ in pairs], [d for _, d in pairs])
    return {} if r is None else {"progress/distance_corr": r}


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's correlation coefficient (None when either side is constant)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)
