"""The critic: a value model, its optimiser and (optionally) its Polyak-averaged target copy; reading values at the
positions the algorithms need, and regressing them toward given targets, data-parallel across processes.

Rows are token rows (``Sample``, ``Transition``: anything with ``prompt_ids`` and ``completion_ids``), laid out as
the learner lays them out (left-padded prompt, right-padded completion). For a row of P prompt and C completion
tokens x_0 … x_{P+C−1}, the value at index k is V(x_{≤k}); the algorithms read three positions:

- ``token``: V(s_t) for each completion token t = 0 … C−1, s_t being the prompt and the first t completion tokens:
  index P − 1 + t (the last prompt token for t = 0). PPO's token-level critic.
- ``state``: index P − 1, the state the row's action was taken in (ArCHer's V(s); a next state s′ is a row with
  its prompt only: ``next_state_values``).
- ``action``: index P + C − 1, the state and the whole utterance (ArCHer's Q(s, a)).

``update`` regresses values toward targets with PPO's value loss (``losses.value_terms``): one loss per
``Regression`` (a position, some heads, one target per entry), each the sum over its heads of ½·the mean over its
positions, summed over the regressions (ArCHer's four MSE terms, halved). Each process holds the whole critic;
every mini-batch is split across the processes (``World.share``), each process's loss weighted so that the mean of
their gradients (``World.average_gradients``) is the whole mini-batch's, as ``PolicyTrainer`` does; the readers
split their rows the same way and gather the values, so every process calls them together.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marl_cli.algorithms.td import polyak_update
from marl_cli.algorithms.values import CriticBatch, Scored, Transition, prompt_only, state_row
from marl_cli.core.padding import pad_rows
from marl_cli.core.world import World
from marl_cli.critics.losses import explained_variance, value_terms
from marl_cli.critics.value_model import ValueModel

POSITIONS = ("token", "state", "action")


@dataclass
class _Entries:
    """One row's regressed values, one entry per (position, head): unpadded index, head, target, the given V_old (0
    where its regression gives none) and the regression's index."""

    index: torch.Tensor
    head: torch.Tensor
    target: torch.Tensor
    old: torch.Tensor
    group: torch.Tensor

    @property
    def size(self) -> int:
        return self.index.numel()


def positions(row: Scored, position: str) -> list[int]:
    """The unpadded indices of ``row`` (prompt then completion) where ``position`` reads (the module's docstring)."""
    prompt, completion = len(row.prompt_ids), len(row.completion_ids)
    if prompt == 0:
        raise ValueError("the critic reads rows with a prompt: this one has none")
    if position == "token":
        return list(range(prompt - 1, prompt + completion - 1))
    if position == "state":
        return [prompt - 1]
    if position == "action":
        return [prompt + completion - 1]
    raise ValueError(f"unknown critic position {position!r}; choose from {', '.join(POSITIONS)}")


def _matrix(values: Sequence[Any] | torch.Tensor, i: int, shape: tuple[int, int], what: str) -> torch.Tensor:
    """Row ``i``'s item of ``values`` as a float64 (positions, heads) matrix."""
    item = torch.as_tensor(values[i], dtype=torch.float64)
    if item.numel() != shape[0] * shape[1]:
        raise ValueError(f"row {i}: {item.numel()} {what} for {shape[0]} positions × {shape[1]} heads")
    return item.reshape(shape)


def _entries(batch: CriticBatch, heads: int) -> list[_Entries]:
    """Every row's entries over ``batch``'s regressions (checked against the rows and the model's ``heads``)."""
    parts: list[list[tuple[torch.Tensor, ...]]] = [[] for _ in batch.rows]
    for g, reg in enumerate(batch.regressions):
        chosen = torch.tensor(list(reg.heads), dtype=torch.long)
        if chosen.numel() == 0 or int(chosen.min()) < 0 or int(chosen.max()) >= heads:
            raise ValueError(f"regression {g}: heads {list(reg.heads)} out of the model's {heads}")
        if len(reg.targets) != len(batch.rows):
            raise ValueError(f"regression {g}: targets for {len(reg.targets)} rows, the batch has {len(batch.rows)}")
        for i, row in enumerate(batch.rows):
            index = torch.tensor(positions(row, reg.position), dtype=torch.long)
            shape = (index.numel(), chosen.numel())
            target = _matrix(reg.targets, i, shape, "targets")
            old = torch.zeros(shape, dtype=torch.float64) if reg.old_values is None else \
                _matrix(reg.old_values, i, shape, "old values")
            parts[i].append((index.repeat_interleave(shape[1]), chosen.repeat(shape[0]), target.flatten(),
                             old.flatten(), torch.full((target.numel(),), g, dtype=torch.long)))
    return [_Entries(*(torch.cat(column) for column in zip(*row, strict=True))) for row in parts]


def _chunks(items: Sequence[int], size: int, world: World) -> list[list[int]]:
    """``items`` in mini-batches of ``size``; a last one too small to give every process an item joins the one
    before it (``policy_trainer.mini_batches``' rule)."""
    chunks = [list(items[i:i + size]) for i in range(0, len(items), size)]
    if len(chunks) > 1 and len(chunks[-1]) < world.size:
        chunks[-2] += chunks.pop()
    return chunks


def row_values(model: ValueModel, rows: Sequence[Scored], index: Sequence[Any]) -> list[torch.Tensor]:
    """Each row's (n_i, heads) values at its unpadded indices ``index[i]`` (``positions``: the last prompt token
    onwards), from one padded forward pass laid out as the learner lays rows out (left-padded prompts, right-padded
    completions), a prompt that several rows share running once (``ValueModel.forward``'s ``prompt_width``)."""
    device = next(model.parameters()).device
    prompts, prompt_mask = pad_rows([list(r.prompt_ids) for r in rows], model.pad_id, left=True)
    completions, completion_mask = pad_rows([list(r.completion_ids) for r in rows], model.pad_id, left=False)
    width = prompts.size(1)
    values = model(torch.cat([prompts, completions], 1).to(device),
                   torch.cat([prompt_mask, completion_mask], 1).to(device), prompt_width=width)
    return [values[b, 1 - len(r.prompt_ids) + torch.as_tensor(index[b], dtype=torch.long, device=device)]
            for b, r in enumerate(rows)]


def _spread(values: torch.Tensor) -> float:
    """The sample standard deviation (0.0 for fewer than two values)."""
    return float(values.std()) if values.numel() > 1 else 0.0


class Critic:
    """Trains a ``ValueModel`` by regression; reads its values (or its target copy's).

    Args:
        model: the value model (trained in place).
        cfg: ``learning_rate``, ``weight_decay`` (AdamW), ``max_grad_norm`` (gradient clipping), ``mini_batch_size``
            (rows per optimiser step, and per forward pass when reading), ``epochs`` (shuffled passes over an
            update's rows), ``value_clip`` (ε of the clipped loss, or None), ``tau`` (the online weights' share in
            ``soft_update``), ``targets`` (keep a target copy; read only when ``targets`` is not given here).
            ``max_grad_norm`` 0 clips nothing.
        world: the processes the update is split across; each holds the whole critic.
        targets: keep a target copy (ArCHer); None: ``cfg.targets``.
    """

    def __init__(self, model: ValueModel, cfg: Any, world: World | None = None, targets: bool | None = None):
        self.model = model
        self.cfg = cfg
        self.world = world or World()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.target: ValueModel | None = None
        """The target copy θ̄ (``cfg.targets``): starts equal to the model, moves only in ``soft_update``."""
        if cfg.targets if targets is None else targets:
            self.target = copy.deepcopy(model).requires_grad_(False).eval()
        self.device = next(model.parameters()).device

    def _network(self, target: bool) -> ValueModel:
        if not target:
            return self.model
        if self.target is None:
            raise ValueError("this critic keeps no target copy (it was built with targets off)")
        return self.target

    @torch.no_grad()
    def _read(self, rows: Sequence[Scored], index: Sequence[Any], target: bool = False) -> list[torch.Tensor]:
        """Each row's (n_i, heads) values at ``index[i]`` on the CPU, no grad: every process scores its share
        (``World.share``) in batches of ``mini_batch_size`` and all get every row's."""
        model = self._network(target)
        model.eval()
        mine = self.world.share(range(len(rows)))
        out: dict[int, torch.Tensor] = {}
        for chunk in _chunks(mine, self.cfg.mini_batch_size, World()):
            values = row_values(model, [rows[i] for i in chunk], [index[i] for i in chunk])
            out.update({i: v.cpu() for i, v in zip(chunk, values, strict=True)})
        merged = {i: v for part in self.world.gather(out) for i, v in part.items()}
        return [merged[i] for i in range(len(rows))]

    def token_values(self, rows: Sequence[Scored], head: int = 0, target: bool = False) -> list[list[float]]:
        """V(s_t) of each completion token t of each row (``token`` position), of head ``head``, no grad."""
        read = self._read(rows, [positions(r, "token") for r in rows], target)
        return [v[:, head].tolist() for v in read]

    def values_at(self, rows: Sequence[Scored], names: Sequence[str], target: bool = False) -> list[torch.Tensor]:
        """(N, heads) values of the rows at each position of ``names`` (``state``, ``action``: one a row), all from
        one read of the rows, no grad, on the CPU; read for its ``state`` alone a row is read as its prompt (a
        causal model's value at the prompt's end does not read the completion)."""
        if list(names) == ["state"]:
            rows = [prompt_only(r) for r in rows]
        read = self._read(rows, [[i for name in names for i in positions(r, name)] for r in rows], target)
        if not read:
            return [torch.zeros(0, self.model.heads, dtype=self.model.head.weight.dtype) for _ in names]
        stacked = torch.stack(read)
        return [stacked[:, k] for k in range(len(names))]

    def state_values(self, rows: Sequence[Scored], target: bool = False) -> torch.Tensor:
        """(N, heads) values at each row's last prompt token (the ``state`` position), no grad, on the CPU."""
        return self.values_at(rows, ["state"], target)[0]

    def action_values(self, rows: Sequence[Scored], target: bool = False) -> torch.Tensor:
        """(N, heads) values at each row's last completion token (the ``action`` position), no grad, on the CPU."""
        return self.values_at(rows, ["action"], target)[0]

    def next_state_values(self, transitions: Sequence[Transition], target: bool = False) -> torch.Tensor:
        """(N, heads) values of each transition's next state s′ (at the last token of ``next_prompt_ids``), 0 for a
        done one (no next state): V(s′) of the TD target r + γ·(1 − done)·V(s′)."""
        return self._next_states_and_actions(transitions, [], target)[0]

    def td_values(self, transitions: Sequence[Transition], target: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``next_state_values`` and the transitions' ``action_values``, from one read."""
        return self._next_states_and_actions(transitions, transitions, target)

    def _next_states_and_actions(self, transitions: Sequence[Transition], rows: Sequence[Scored],
                                 target: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``next_state_values`` of ``transitions`` and ``action_values`` of ``rows``, from one read."""
        live = [i for i, t in enumerate(transitions) if t.next_prompt_ids is not None]
        states = [state_row(transitions[i].next_prompt_ids or []) for i in live]
        read = self._read([*states, *rows], [positions(r, "state") for r in states] +
                          [positions(r, "action") for r in rows], target)
        heads, dtype = self.model.heads, self.model.head.weight.dtype
        following = torch.zeros(len(transitions), heads, dtype=dtype)
        if live:
            following[live] = torch.cat(read[:len(live)]).to(dtype)
        here = torch.cat(read[len(live):]) if rows else torch.zeros(0, heads, dtype=dtype)
        return following, here

    def soft_update(self) -> None:
        """θ̄ ← (1 − τ)·θ̄ + τ·θ (``polyak_update``, τ = ``cfg.tau``); a critic without targets is a ValueError."""
        polyak_update(self._network(True), self.model, self.cfg.tau)

    def update(self, batch: CriticBatch, rng: random.Random) -> dict[str, float]:
        """Regress the values toward ``batch``'s targets: ``epochs`` passes over its rows, shuffled by ``rng`` (the
        same on every process), one optimiser step per mini-batch of ``mini_batch_size`` rows. Returns the mean
        over the steps of ``value_loss``, ``grad_norm`` (before clipping) and, with a value clip,
        ``value_clip_fraction``; and, of the values before the update over every entry, ``td_error/mean``
        (mean |R − V|), ``explained_variance``, ``value/mean``, ``value/std``, ``target/mean``, ``target/std``.
        {} when no row has an entry (e.g. every completion is empty at the token position).

        Only the clip reads V_old: without ``value_clip`` no pass reads the values before the update, and the
        statistics take each entry's value at its first regression (the values before the update when the first
        epoch is one mini-batch; later mini-batches of it see the earlier ones' steps)."""
        if not batch.regressions:
            raise ValueError("a critic update needs at least one regression")
        entries = _entries(batch, self.model.heads)
        if not any(e.size for e in entries):
            return {}
        given = all(reg.old_values is not None for reg in batch.regressions)
        old = self._old_values(batch, entries) if given or self.cfg.value_clip is not None else None
        stats: dict[str, list[float]] = defaultdict(list)
        first: dict[int, torch.Tensor] = {}
        self.model.train()
        for _ in range(self.cfg.epochs):
            order = rng.sample(range(len(entries)), len(entries))
            for chunk in _chunks(order, self.cfg.mini_batch_size, self.world):
                self._step(batch, entries, old, chunk, stats, first)
        self.model.eval()
        out = {key: sum(v) / len(v) for key, v in self._gathered(stats).items() if v}
        if old is None:
            seen = {i: v for part in self.world.gather(first) for i, v in part.items()}
            old = [seen.get(i, e.old) for i, e in enumerate(entries)]  # a row without entries: nothing to read
        return {**out, **_before(entries, old)}

    def _old_values(self, batch: CriticBatch, entries: list[_Entries]) -> list[torch.Tensor]:
        """V_old of every row's entries: the regression's given ``old_values``, else the values now."""
        given = torch.tensor([reg.old_values is not None for reg in batch.regressions])
        if bool(given.all()):
            return [e.old for e in entries]
        read = self._read(batch.rows, [e.index for e in entries])
        return [torch.where(given[e.group], e.old, v[torch.arange(e.size), e.head].double())
                for e, v in zip(entries, read, strict=True)]

    def _step(self, batch: CriticBatch, entries: list[_Entries], old: list[torch.Tensor] | None, chunk: list[int],
              stats: dict[str, list[float]], first: dict[int, torch.Tensor]) -> None:
        """One optimiser step on the mini-batch ``chunk`` (row indices), this process's share of it in the loss;
        ``first`` gets the values of the rows regressed for the first time."""
        groups = torch.cat([entries[i].group for i in chunk])
        if groups.numel() == 0:
            return
        heads = torch.tensor([len(reg.heads) for reg in batch.regressions], dtype=torch.float64)
        # an entry's weight: its regression's heads over its entries in the whole mini-batch (= 1 / its positions)
        weight = heads / torch.bincount(groups, minlength=heads.numel()).clamp(min=1)
        mine = [i for i in self.world.share(chunk) if entries[i].size]
        loss, moved = self._loss(batch, entries, old, mine, weight, first) if mine else (torch.zeros(()), 0)
        if mine:
            loss.backward()
        if self.cfg.value_clip is not None:
            stats["value_clip_fraction"].append(moved * self.world.size / groups.numel())
        self.world.average_gradients(self.params)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm or float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats["value_loss"].append(float(loss.detach()))
        stats["grad_norm"].append(float(norm))

    def _loss(self, batch: CriticBatch, entries: list[_Entries], old: list[torch.Tensor] | None, mine: list[int],
              weight: torch.Tensor, first: dict[int, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """This process's share of a mini-batch's loss, size·Σ weight·ℓ over the entries of the rows ``mine`` (the
        ranks' mean is the whole mini-batch's loss), and how many of them moved out of the value clip (``old``:
        V_old, None without a clip)."""
        values = row_values(self.model, [batch.rows[i] for i in mine], [entries[i].index for i in mine])
        parts = [x[torch.arange(entries[i].size, device=self.device), entries[i].head.to(self.device)]
                 for i, x in zip(mine, values, strict=True)]
        for i, part in zip(mine, parts, strict=True):
            first.setdefault(i, part.detach().double().cpu())
        v = torch.cat(parts)
        target = torch.cat([entries[i].target for i in mine]).to(v)
        before = None if old is None else torch.cat([old[i] for i in mine]).to(v)
        w = weight[torch.cat([entries[i].group for i in mine])].to(v)
        loss = self.world.size * (value_terms(v, before, target, self.cfg.value_clip) * w).sum()
        clip = self.cfg.value_clip
        moved = 0 if clip is None or before is None else int(((v.detach() - before).abs() > clip).sum())
        return loss, moved

    def _gathered(self, stats: dict[str, list[float]]) -> dict[str, list[float]]:
        """Every process's values of each statistic (each one's loss is its weighted share: their mean is the
        loss)."""
        merged: dict[str, list[float]] = defaultdict(list)
        for part in self.world.gather(dict(stats)):
            for key, values in part.items():
                merged[key] += values
        return merged

    def state_dict(self) -> dict[str, Any]:
        """The model's, the target copy's (None without one) and the optimiser's state."""
        return {"model": self.model.state_dict(),
                "target": None if self.target is None else self.target.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict``'s state: updates after it equal those of the critic that saved it."""
        self.model.load_state_dict(state["model"])
        if self.target is not None:
            if state["target"] is None:
                raise ValueError("this critic keeps a target copy; the state has none")
            self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])


def _before(entries: list[_Entries], old: list[torch.Tensor]) -> dict[str, float]:
    """Statistics of the values before an update against their targets, over every entry."""
    target, value = torch.cat([e.target for e in entries]), torch.cat(old)
    ones = torch.ones_like(target)
    return {"td_error/mean": float((target - value).abs().mean()),
            "explained_variance": explained_variance(value, target, ones),
            "value/mean": float(value.mean()), "value/std": _spread(value),
            "target/mean": float(target.mean()), "target/std": _spread(target)}
