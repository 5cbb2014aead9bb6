"""The per-policy update, delegated to TRL's GRPOTrainer (only ever through ``training/learner/trl_adapter.py``).

marl produces its own rollouts and advantages, so it uses TRL's trainer for what TRL owns: the
clipped policy loss (``loss_type``, ``epsilon``, ``beta`` and the other knobs, ``trl_adapter.LOSS_KNOBS``), the
log-probabilities at the rollout temperature, the optimiser, the learning-rate scheduler and gradient clipping.
Each RL step calls ``update`` with that policy's sample rows; the scheduler advances once per RL step. Masking
truncated completions is marl's (TRL does it in its generation loop): their tokens leave the loss mask.

The step is TRL's and verl's: the old log-probs (the PPO ratio's denominator) of every mini-batch
are the sampling policy's, computed before the first optimiser step; the first mini-batch trained takes its trained
rows' from its own loss forward, detached (as TRL when its samples are fresh), unless something reads them before the
loss (an importance-sampling correction, the off-policy mask);
the reference is the policy as RL found it (after the warm start). Rows whose gradient is zero (a zero
advantage with β = 0, e.g. every row of an equal-reward group; a masked truncated completion) get the forward
passes of the diagnostics but no loss forward or backward: the others' loss is weighted by their share of the
mini-batch's normaliser, so the update is the full mini-batch's (every row runs where the loss reads them all:
an entropy bonus, a top-entropy quantile). Rows that share a prompt run it through the model once, in the
scoring and in the loss (``shared_prompt_forward``). A bf16/fp16 policy trains with
fp32 master weights and optimiser state under autocast; ``trainer.sharding=fsdp2`` splits the learner across
the processes (``training/learner/sharding.py``). Every step reports what RL researchers look
at: the sampler-vs-learner log-prob gap, entropy, KL to the old policy and to the reference, clip
fractions and advantage statistics.
"""

from __future__ import annotations

import random
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from marl_cli.core.padding import pad_rows
from marl_cli.core.samples import Sample
from marl_cli.core.world import World
from marl_cli.losses.base import LOSS_TERMS, LossTerm
from marl_cli.policies.regime import Policy
from marl_cli.training.learner.sharding import gather_into, load_optimizer_state, master_weights, optimizer_state, split
from marl_cli.training.learner.trl_adapter import (
    LOSS_MASK,
    GRPOAdapter,
    add_sampler_logps,
    grpo_args,
    importance_ratio,
    loss_mask,
)


def collate(samples: list[Sample], pad_id: int, device: torch.device,
            mask_truncated: bool = False) -> dict[str, torch.Tensor]:
    """The tensors TRL's GRPO loss reads: left-padded prompts, right-padded completions, advantages.

    Each mini-batch is one optimiser step, so token-sum losses are normalised by its own token count.
    ``sampling_logps``/``sampling_mask`` carry the sampler's log-probs where the generator gave them. With
    ``mask_truncated`` the loss mask (``LOSS_MASK``) leaves out the rows whose completion did not finish, and the
    token count with them (as TRL's ``mask_truncated_completions``; the forward still attends to their tokens).
    """
    prompt_ids, prompt_mask = pad_rows([s.prompt_ids for s in samples], pad_id, left=True)
    completion_ids, completion_mask = pad_rows([s.completion_ids for s in samples], pad_id, left=False)
    sampling = torch.zeros(completion_ids.shape, dtype=torch.float32)
    sampling_mask = torch.zeros(completion_ids.shape, dtype=torch.long)
    for i, s in enumerate(samples):
        if len(s.sampling_logprobs) == len(s.completion_ids):
            sampling[i, :len(s.completion_ids)] = torch.tensor(s.sampling_logprobs, dtype=torch.float32)
            sampling_mask[i, :len(s.completion_ids)] = 1
    batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
             "completion_mask": completion_mask, "advantages": advantage_tensor(samples, completion_ids.size(1)),
             "sampling_logps": sampling, "sampling_mask": sampling_mask}
    if mask_truncated:
        finished = torch.tensor([s.finished for s in samples], dtype=completion_mask.dtype)
        batch[LOSS_MASK] = completion_mask * finished.unsqueeze(1)
    batch["num_items_in_batch"] = loss_mask(batch).sum()  # token-sum losses (dapo, cispo, vespo) divide by it
    return {k: v.to(device) for k, v in batch.items()}


def advantage_tensor(samples: list[Sample], width: int) -> torch.Tensor:
    """The rows' advantages as TRL's loss takes them: (B,) with one per row, or (B, ``width``) with one per
    completion token (zero on padding) when any row carries per-token advantages."""
    if not any(s.token_advantages for s in samples):
        return torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    out = torch.zeros(len(samples), width, dtype=torch.float32)
    for i, s in enumerate(samples):
        values = s.per_token()
        if len(values) != len(s.completion_ids):
            raise ValueError(f"row (task {s.task}, turn {s.turn}, role {s.role}) has {len(values)} token advantages "
                             f"for {len(s.completion_ids)} completion tokens")
        out[i, :len(values)] = torch.tensor(values, dtype=torch.float32)
    return out


def by_temperature(rows: list[Sample], default: float) -> dict[float, list[Sample]]:
    """``rows`` grouped by the temperature each was sampled at (``default`` where a row does not say), in order:
    a mini-batch holds one temperature, as the learner scores each row at its own."""
    groups: dict[float, list[Sample]] = {}
    for s in rows:
        groups.setdefault(default if s.temperature is None else s.temperature, []).append(s)
    return groups


def mini_batches(rows: list[Sample], size: int, world: World) -> list[list[Sample]]:
    """``rows`` in mini-batches of ``size``; across several processes a last one too small to give every
    rank a row joins the one before it."""
    batches = [rows[i:i + size] for i in range(0, len(rows), size)]
    if len(batches) > 1 and len(batches[-1]) < world.size:
        last = batches.pop()
        batches[-1] = batches[-1] + last
    return batches


def loss_tokens(sample: Sample, mask_truncated: bool = False) -> int:
    """The completion tokens of ``sample`` the loss counts: none of a truncated one under ``mask_truncated``."""
    return 0 if mask_truncated and not sample.finished else len(sample.completion_ids)


def loss_weight(loss_type: str, trained: list[Sample], batch: list[Sample], world: World,
                mask_truncated: bool = False, copies: int = 0) -> float:
    """What the loss of ``trained`` (the rows this rank back-propagates) is multiplied by so that the ranks'
    mean gradient is the gradient of the whole mini-batch ``batch``'s loss: ``size`` × their share of the loss's
    normaliser (sequences for per-sequence means, the completion tokens the loss counts for the token mean,
    ``loss_tokens``); the token-sum losses (dapo, cispo, vespo) are already normalised by the whole mini-batch's
    token count (``num_items_in_batch``), per process. Rows left out of ``trained`` must contribute no gradient; its
    last ``copies`` rows (``select_rows``' zeroed copies) count in the per-sequence means, not in the token mean."""
    if loss_type in ("dapo", "cispo", "vespo"):
        return 1.0
    if loss_type == "bnpo":
        tokens = sum(loss_tokens(s, mask_truncated) for s in trained[:len(trained) - copies])
        return world.size * tokens / max(sum(loss_tokens(s, mask_truncated) for s in batch), 1)
    return world.size * len(trained) / len(batch)


def reads_whole_batch(trainer_cfg: Any, term: LossTerm | None = None) -> bool:
    """Whether the loss of a row depends on the other rows passed with it beyond the normaliser, or has a gradient
    without an advantage: an entropy bonus (TRL's, a token mean over every row passed), a loss ``term`` with a gradient
    on every row (EPO's) or a top-entropy quantile (taken over their tokens)."""
    bonus = trainer_cfg.entropy_coef != 0.0 or trainer_cfg.use_adaptive_entropy or (term is not None and term.every_row)
    return bonus or trainer_cfg.top_entropy_quantile < 1.0


def with_gradient(rows: list[Sample], beta: float, skip_zero_advantage: bool = True, whole_batch: bool = False,
                  mask_truncated: bool = False) -> list[int]:
    """The indices of ``rows`` to back-propagate: all of them unless ``skip_zero_advantage``, or when the loss reads
    the whole batch (``whole_batch``: ``reads_whole_batch``); else the rows whose tokens the loss counts (not a
    truncated one under ``mask_truncated``) with a KL penalty (β > 0) or a non-zero advantage on some token — every
    loss type multiplies each token's policy term by its advantage, and every term by the loss mask, so the others
    have no gradient."""
    if whole_batch or not skip_zero_advantage:
        return list(range(len(rows)))
    return [i for i, s in enumerate(rows) if loss_tokens(s, mask_truncated) and (beta != 0.0 or s.trains())]


def select_rows(batch: dict[str, torch.Tensor], index: list[int], zeroed: int = 0) -> dict[str, torch.Tensor]:
    """The rows ``index`` of a collated mini-batch, cut to their own longest prompt (left) and completion (right);
    the last ``zeroed`` of them (copies that only even out the ranks' batch sizes) get advantage 0 and leave the loss
    mask (``LOSS_MASK``), so they add no gradient, also with a KL penalty or an entropy bonus."""
    if index == list(range(len(batch["advantages"]))) and not zeroed:
        return batch
    rows = torch.tensor(index, device=batch["advantages"].device)
    prompt_width = int(batch["prompt_mask"][rows].sum(1).max())
    completion_width = int(batch["completion_mask"][rows].sum(1).max())
    full_prompt, full_completion = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
    out = {}
    for key, value in batch.items():
        if not torch.is_tensor(value) or value.dim() == 0:
            out[key] = value
            continue
        value = value[rows]
        if key.startswith("prompt_"):
            value = value[:, full_prompt - prompt_width:]
        elif value.dim() == 2 and value.size(1) == full_completion:
            value = value[:, :completion_width]
        out[key] = value
    if zeroed:  # the copies pass through the loss without a term of their own (KL penalty and entropy bonus too)
        out["advantages"][len(index) - zeroed:] = 0.0
        out[LOSS_MASK] = out.get(LOSS_MASK, torch.ones_like(out["completion_mask"])).clone()
        out[LOSS_MASK][len(index) - zeroed:] = 0
    return out


def clip_fractions(ratio: torch.Tensor, batch: dict[str, torch.Tensor], low: float, high: float, tokens: float,
                   delta: float | None = None) -> dict[str, float]:
    """TRL's clip fractions (a token is clipped low when its ratio, ``importance_ratio``, is under 1 − ε_low with a
    negative advantage, high when over 1 + ε_high with a positive one) over the ``tokens`` completion tokens the loss
    counts in the whole mini-batch (at the sequence level, each token of a clipped sequence); with ``delta``, also
    the two-sided clip's (a ratio over δ with a negative advantage). Rows left out of ``batch`` have no gradient, so
    none of their tokens is clipped."""
    advantages = batch["advantages"]
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    mask = loss_mask(batch).bool()
    low_clipped = (ratio < 1 - low) & (advantages < 0) & mask
    high_clipped = (ratio > 1 + high) & (advantages > 0) & mask
    out = {"clip_ratio/low_mean": float(low_clipped.sum()) / tokens,
           "clip_ratio/high_mean": float(high_clipped.sum()) / tokens,
           "clip_ratio/region_mean": float((low_clipped | high_clipped).sum()) / tokens}
    if delta is not None:
        out["clip_ratio/delta_mean"] = float(((ratio > delta) & (advantages < 0) & mask).sum()) / tokens
    return out


def approx_kl(sample_logps: torch.Tensor, other_logps: torch.Tensor, mask: torch.Tensor) -> float:
    """KL(sampler ‖ other) per token, Schulman's k3 estimator on tokens drawn from the sampler, masked mean."""
    delta = other_logps - sample_logps
    per_token = torch.exp(delta) - delta - 1
    return float((per_token * mask).sum() / mask.sum().clamp(min=1))


@dataclass
class MiniBatch:
    """This process's share of one mini-batch: its collated rows, the rows to back-propagate (``index``; its last
    ``zeroed`` are zero-advantage copies that even out the ranks), the weight of their loss, and the sampling policy's
    per-token log-probs and entropies of every row (``PolicyTrainer._prepare``)."""

    batch: dict[str, torch.Tensor]
    index: list[int]
    zeroed: int
    weight: float
    old: torch.Tensor | None = None
    entropies: torch.Tensor | None = None

    def trained(self) -> list[int]:
        """The distinct rows back-propagated (``index`` without its copies)."""
        return self.index[:len(self.index) - self.zeroed]


def put_rows(target: torch.Tensor | None, rows: list[int], values: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``values`` (one row for each of ``rows``, right-padded to their own width) written into ``target``'s rows (a
    new one of zeros of ``shape``, in their dtype, where None)."""
    if target is None:
        target = values.new_zeros(shape)
    target[rows, :values.size(1)] = values
    return target


def advantage_stats(rows: list[Sample], stats: dict[str, list[float]]) -> None:
    """The mean and spread of the rows' advantages (and of their tokens', where credit was given token by token)."""
    advantages = torch.tensor([s.advantage for s in rows])
    stats["advantage/mean"].append(float(advantages.mean()))
    stats["advantage/std"].append(float(advantages.std()) if len(rows) > 1 else 0.0)
    if any(s.token_advantages for s in rows):
        tokens = torch.tensor([a for s in rows for a in s.per_token()])
        stats["advantage/token_mean"].append(float(tokens.mean()))
        stats["advantage/token_std"].append(float(tokens.std()) if tokens.numel() > 1 else 0.0)
        stats["advantage/token_min"].append(float(tokens.min()))
        stats["advantage/token_max"].append(float(tokens.max()))


class PolicyTrainer:
    """Optimises one policy with TRL's GRPO loss on rows marl hands it.

    Args:
        policy: the policy to train (its model is trained in place; under ``trainer.sharding=fsdp2`` across
            processes that model is sharded into the learner, and the policy gets a whole copy in its compute dtype,
            refreshed after every update).
        trainer_cfg: the ``trainer`` config (learning rate, scheduler, loss type, clipping, β, ...).
        temperature: the temperature of rows that do not carry their own (``Sample.temperature``); each row is
            scored at the temperature it was sampled at, so log-probabilities match the sampler's.
        max_completion_length: the rollout's ``max_new_tokens`` (used by the ``dr_grpo`` loss).
        output_dir: where TRL may write (nothing is written during marl's updates).
        seed: seeds TRL's trainer construction.
        world: the processes the update is split across (each mini-batch is, data-parallel).
    """

    def __init__(self, policy: Policy, trainer_cfg: Any, temperature: float, max_completion_length: int,
                 output_dir: Path, seed: int, world: World | None = None, loss: Any = None):
        self.policy = policy
        self.cfg = trainer_cfg
        self.temperature = temperature
        self.world = world or World()
        policy.activate()  # the optimiser takes the parameters that require grad: this adapter's only
        model = policy.model
        if trainer_cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        args = grpo_args(trainer_cfg, temperature, max_completion_length, output_dir, seed, model.device,
                         policy.autocast_dtype)
        self.sharded = trainer_cfg.sharding == "fsdp2" and self.world.size > 1
        whole = model
        if self.sharded:
            if policy.adapter is not None:
                raise ValueError(f"trainer.sharding=fsdp2 trains full models; policy {policy.name!r} is an adapter")
            model, whole = split(model, self.world, policy.compute_dtype)
        self.grpo = GRPOAdapter(model, policy.tokenizer, args, trainer_cfg, self.world, self.sharded)
        """TRL's trainer, behind the adapter that is marl's only way to it."""
        self.learner = self.grpo.model
        """The module the optimiser trains and the scoring runs on (sharded under ``fsdp2``)."""
        self.model = policy.model = whole if self.sharded else self.learner
        """The policy's whole model (rollouts; the learner itself unless sharded)."""
        if self.sharded:
            policy.mark_updated()
        self.device = self.model.device
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.reference = None
        if policy.adapter is None and (trainer_cfg.beta != 0.0 or trainer_cfg.log_ref_kl):
            self.reference = self.grpo.frozen_copy(self.model)
        self.term: LossTerm | None = None if loss is None else LOSS_TERMS.get(loss.name).build(loss, trainer_cfg)
        """The loss term added to TRL's (``loss=<name>``, this policy's settings), or None."""
        self.term_name = None if self.term is None else loss.name
        self.grpo.keep_entropies(self.term is not None and self.term.entropies)
        self.step = 0
        """How many RL steps came before the one being trained (a loss term's k)."""
        self._entropy = [0.0, 0.0]
        """This step's entropy sum and token count over the rows the loss counts (a loss term's history)."""

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.grpo.optimizer

    @property
    def scheduler(self) -> Any:
        return self.grpo.scheduler

    @torch.no_grad()
    def _forward(self, model: Any, batch: dict[str, torch.Tensor],
                 entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``model``'s per-token log-probs of ``batch``'s completions (and entropies with ``entropy``), no grad."""
        return self.grpo.logps(model, batch, entropy)

    def _logps(self, model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._forward(model, batch)[0]

    def _reference_logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.policy.adapter is None:
            return self._logps(self.reference, batch)
        with self.policy.reference() as base:
            return self._logps(base, batch)

    def _prepare(self, batch: dict[str, torch.Tensor], stats: dict[str, list[float]],
                 later: list[int] | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Before any optimiser step: the sampling policy's per-token log-probs (``batch["old_per_token_logps"]``)
        and entropies of ``batch``'s rows, returned, and the reference's log-probs. The rows ``later`` are left at zero
        (None where every row is one; the old log-probs stay out of ``batch``): the first step's loss forward gives
        theirs (``_fill_old``)."""
        later = later or []
        shape, skipped = batch["completion_ids"].shape, set(later)
        rest = [i for i in range(shape[0]) if i not in skipped]
        old = entropies = None
        if not later:
            old, entropies = self._forward(self.learner, batch, entropy=True)
            batch["old_per_token_logps"] = old
        elif rest:
            part_old, part_entropies = self._forward(self.learner, select_rows(batch, rest), entropy=True)
            old, entropies = put_rows(None, rest, part_old, shape), put_rows(None, rest, part_entropies, shape)
        if self.cfg.off_policy_mask_threshold is not None:
            add_sampler_logps(batch, old)
        if self.cfg.is_correction != "none":
            batch["importance_sampling_ratio"] = self._is_ratio(old, batch, stats)
        if self.cfg.beta != 0.0 or self.cfg.log_ref_kl:
            batch["ref_per_token_logps"] = self._reference_logps(batch)
        return old, entropies

    def _sampler_stats(self, mb: MiniBatch, stats: dict[str, list[float]]) -> None:
        """The sampling policy's entropy over ``mb``'s tokens the loss counts, its log-prob gap to the sampler's and
        its KL to the reference."""
        batch, old, mask = mb.batch, mb.old, mb.batch["completion_mask"]
        entropy_sum = float((mb.entropies * loss_mask(batch)).sum())
        stats["entropy"].append(entropy_sum / self._token_share(batch))
        self._entropy = [self._entropy[0] + entropy_sum, self._entropy[1] + float(loss_mask(batch).sum())]
        sampled = batch["sampling_mask"].bool()
        if sampled.any():
            gap = (old - batch["sampling_logps"]).abs()[sampled]
            stats["logprob_gap/mean"].append(float(gap.mean()))
            stats["logprob_gap/max"].append(float(gap.max()))
        if "ref_per_token_logps" in batch:
            stats["kl_ref"].append(approx_kl(old, batch["ref_per_token_logps"], mask))

    def _is_ratio(self, old: torch.Tensor, batch: dict[str, torch.Tensor],
                  stats: dict[str, list[float]]) -> torch.Tensor:
        """The truncated importance weight of each token (``trainer.is_correction``), as TRL's vLLM path defines
        it: exp(learner − sampler log-prob) per token or per sequence (summed), clamped to
        [``is_clip_min``, ``is_clip_max``] (``*_truncate``) or zeroed outside it (``*_mask``); 1 where the
        generator gave no log-probs."""
        mode, low, high = self.cfg.is_correction, self.cfg.is_clip_min, self.cfg.is_clip_max
        diff = (old - batch["sampling_logps"]) * batch["sampling_mask"]
        if mode.startswith("sequence"):
            diff = diff.sum(-1, keepdim=True)
        ratio = torch.exp(diff)
        if mode.endswith("truncate"):
            ratio = ratio.clamp(min=low, max=high)
        else:
            ratio = ratio.masked_fill((ratio < (low or 0.0)) | (ratio > high), 0.0)
        kept = ratio.expand_as(old)[batch["completion_mask"].bool()]
        stats["is_ratio/mean"].append(float(kept.mean()))
        stats["is_ratio/min"].append(float(kept.min()))
        stats["is_ratio/max"].append(float(kept.max()))
        return ratio

    def _token_share(self, batch: dict[str, torch.Tensor]) -> float:
        """The whole mini-batch's completion tokens over the ranks: a rank's token sum divided by it, averaged
        over the ranks, is the whole mini-batch's token mean."""
        return max(float(batch["num_items_in_batch"]), 1.0) / self.world.size

    def _loss_stats(self, batch: dict[str, torch.Tensor], tokens: float, stats: dict[str, list[float]]) -> None:
        """KL to the old policy over the rows just back-propagated; clip fractions and the share of tokens the
        off-policy mask drops over the whole mini-batch's tokens that the loss counts (``tokens``: its share per
        rank; the rows left out have no gradient, so none of their tokens is clipped or dropped)."""
        old, new = batch["old_per_token_logps"], self.grpo.last_logps
        stats["kl_old"].append(approx_kl(old, new, batch["completion_mask"]))
        clip = self.grpo.clip_range
        if clip is not None:
            ratio = importance_ratio(new, old, loss_mask(batch), self.cfg.importance_sampling_level)
            for key, value in clip_fractions(ratio, batch, *clip, tokens, self.cfg.delta).items():
                stats[key].append(value)
        kept = self.grpo.off_policy_kept(batch, new)
        if kept is not None:
            dropped = (1 - kept).expand_as(new) * loss_mask(batch)
            stats["off_policy_masked_fraction"].append(float(dropped.sum()) / tokens)

    def update(self, samples: list[Sample], rng: random.Random, step: int = 0) -> dict[str, float]:
        """One RL step for this policy, after ``step`` others (EPO's k): ``num_iterations`` passes of mini-batch
        gradient steps."""
        self.step = step
        rows = [s for s in samples if s.keep]
        lr = self.scheduler.get_last_lr()[0]
        stats: dict[str, list[float]] = defaultdict(list)
        trains = len(rows) >= self.world.size
        if trains:
            self._train(rows, rng, stats)
        with warnings.catch_warnings():  # the schedule advances per RL step, also one with nothing to train
            if not trains:
                warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step\\(\\)` before", UserWarning)
            self.scheduler.step()
        out = self._summary(self._gathered(stats))
        out["learning_rate"] = lr
        out["rows"] = float(len(rows))
        out["dropped_rows"] = float(len(samples) - len(rows))
        return out

    def _train(self, rows: list[Sample], rng: random.Random, stats: dict[str, list[float]]) -> None:
        """The optimiser steps of one RL step on ``rows`` (at least one per process), their statistics into
        ``stats``. The first mini-batch trained takes its old log-probs from its own loss forward where it can
        (``_self_scoring``); the others' are computed before any optimiser step."""
        batches = self._mini_batches(rows)
        if self.cfg.mask_truncated_completions:
            stats["masked_truncated_fraction"].append(sum(not s.finished for s in rows) / len(rows))
        self.policy.activate()
        self.learner.train()
        self._entropy = [0.0, 0.0]
        order = rng.sample(batches, len(batches))
        fused = self._self_scoring(order[0])
        for mb in batches:
            mb.old, mb.entropies = self._prepare(mb.batch, stats, mb.trained() if mb is fused else None)
        for iteration in range(self.cfg.num_iterations):
            for mb in order if iteration == 0 else rng.sample(batches, len(batches)):
                self._step(mb, stats)
        for mb in batches:
            self._sampler_stats(mb, stats)
        if self.sharded:
            gather_into(self.learner, self.model)
        self.policy.mark_updated()
        if self.term is not None:  # after the step's updates: EPO's H̄ of step k is over the steps before it
            sums = self.world.gather(self._entropy)
            self.term.after_step(sum(s[0] for s in sums), sum(s[1] for s in sums))
        advantage_stats(rows, stats)
        stats["mini_batches"].append(float(len(batches)))

    def _self_scoring(self, mb: MiniBatch) -> MiniBatch | None:
        """``mb`` if the first optimiser step, on it, can take the old log-probs of its trained rows from its own
        loss forward (detached, as TRL does when the samples are fresh): nothing reads them before the loss (no
        importance-sampling correction, no off-policy mask); on an FSDP2-sharded learner only where no rank's share
        has rows left out of the loss (forwards there are collective: every rank runs as many)."""
        if self.cfg.is_correction != "none" or self.cfg.off_policy_mask_threshold is not None or not mb.trained():
            return None
        if self.sharded and not all(self.world.gather(len(mb.trained()) == len(mb.batch["advantages"]))):
            return None
        return mb

    def _mini_batches(self, rows: list[Sample]) -> list[MiniBatch]:
        """This process's share of each mini-batch of ``rows``, collated, with the indices of its rows to
        back-propagate, how many of those are zero-advantage copies, and the weight of their loss."""
        pad_id = self.policy.tokenizer.pad_token_id
        wholes = [whole for part in by_temperature(rows, self.temperature).values()
                  for whole in mini_batches(part, self.cfg.mini_batch_size, self.world)]
        shares = [self.world.share(whole) for whole in wholes]
        masked = self.cfg.mask_truncated_completions
        whole_batch = reads_whole_batch(self.cfg, self.term)
        trained = [with_gradient(mine, self.cfg.beta, self.cfg.skip_zero_advantage, whole_batch, masked)
                   for mine in shares]
        # every rank runs the loss (TRL's gathers per-row metrics across ranks) on as many rows of each
        # mini-batch, at least one: zero-advantage copies fill up
        counts = [max(1, *n) for n in zip(*self.world.gather([len(t) for t in trained]), strict=True)]
        batches = []
        for whole, mine, kept, count in zip(wholes, shares, trained, counts, strict=True):
            batch = collate(mine, pad_id, self.device, masked)
            batch["temperature"] = self.temperature if whole[0].temperature is None else whole[0].temperature
            tokens = sum(loss_tokens(s, masked) for s in whole)  # the token-sum losses' normaliser
            batch["num_items_in_batch"] = torch.tensor(tokens, device=self.device)
            if self.term is not None:
                counted = [loss_tokens(s, masked) > 0 for s in whole]
                dtype = torch.promote_types(self.policy.compute_dtype, torch.float32)  # float64 where the model is
                self.term.prepare(batch, whole, counted, self.world, dtype)
            zeroed = count - len(kept)
            index = kept + [kept[0] if kept else 0] * zeroed
            weight = loss_weight(self.cfg.loss_type, [mine[i] for i in index], whole, self.world, masked, zeroed)
            batches.append(MiniBatch(batch, index, zeroed, weight))
        return batches

    def _step(self, mb: MiniBatch, stats: dict[str, list[float]]) -> None:
        """One optimiser step on the rows ``mb.index`` of the mini-batch ``mb`` (see ``select_rows``), the loss
        multiplied by ``mb.weight``."""
        batch = select_rows(mb.batch, mb.index, mb.zeroed)
        loss = self.grpo.loss(self.learner, batch) * mb.weight
        if "old_per_token_logps" not in batch:
            self._fill_old(mb, batch)
        if self.term is not None:
            term, term_stats = self.term(batch, self.grpo.last_entropies, loss_mask(batch), self.step)
            loss = loss + term
            for key, value in term_stats.items():
                stats[key].append(value)
        self._loss_stats(batch, self._token_share(mb.batch), stats)
        self.grpo.backward(loss)
        if not self.sharded:  # FSDP2 reduce-scatters the ranks' mean gradient in the backward pass
            self.world.average_gradients(self.params)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats["loss"].append(loss.item())
        stats["grad_norm"].append(float(norm))
        stats["trained_row_fraction"].append((len(mb.index) - mb.zeroed) / len(mb.batch["advantages"]))

    def _fill_old(self, mb: MiniBatch, batch: dict[str, torch.Tensor]) -> None:
        """The old log-probs and entropies of ``mb``'s trained rows from the loss forward just run on ``batch`` (its
        rows ``mb.index``, before any optimiser step), into ``mb`` and both batches."""
        new, entropies = self.grpo.last_logps, self.grpo.last_entropies.detach()
        rows, shape = mb.trained(), mb.batch["completion_ids"].shape
        mb.old = put_rows(mb.old, rows, new[:len(rows)], shape)
        mb.entropies = put_rows(mb.entropies, rows, entropies[:len(rows)], shape)
        mb.batch["old_per_token_logps"] = mb.old
        batch["old_per_token_logps"] = new

    def _summary(self, stats: dict[str, list[float]]) -> dict[str, float]:
        """One number per statistic (the max of ``*/max``, the min of ``*/min``, else the mean), then TRL's loss
        metrics."""
        out = {k: (max(v) if k.endswith("/max") else min(v) if k.endswith("/min") else sum(v) / len(v))
               for k, v in stats.items() if v}
        out.update(self.grpo.drain_metrics())
        return out

    def _gathered(self, stats: dict[str, list[float]]) -> dict[str, list[float]]:
        """Every rank's values of each statistic (a rank's loss is its weighted share: their mean is the loss)."""
        if self.world.size == 1:
            return stats
        merged: dict[str, list[float]] = defaultdict(list)
        for part in self.world.gather(dict(stats)):
            for key, values in part.items():
                merged[key] += values
        return merged

    def master_weights(self) -> dict[str, torch.Tensor] | None:
        """Sharded: the learner's whole fp32 weights by name, which a checkpoint holds rather than the policy's
        compute-dtype copy (every rank calls it; rank 0's holds them); else None (the policy's model is the learner)."""
        return master_weights(self.learner) if self.sharded else None

    def state_dict(self) -> dict[str, Any]:
        """The optimiser's, scheduler's and loss's state (the adaptive entropy controller's:
        ``GRPOAdapter.loss_state``). Under ``trainer.sharding=fsdp2`` the optimiser's whole state by parameter name
        (gathered from the ranks' shards: every rank calls it), which any process count loads."""
        by_name = self.cfg.sharding == "fsdp2"
        optimizer = optimizer_state(self.learner, self.optimizer) if by_name else self.optimizer.state_dict()
        loss = self.grpo.loss_state()
        if self.term is not None:
            loss[self.term_name] = self.term.state_dict()
        return {"optimizer": optimizer, "scheduler": self.scheduler.state_dict(), "loss": loss}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict``'s (one saved before the loss had a state: the loss as configured)."""
        if self.cfg.sharding == "fsdp2":
            load_optimizer_state(self.learner, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        loss = dict(state.get("loss", {}))
        terms = {name: loss.pop(name) for name in LOSS_TERMS.names() if name in loss}
        self.grpo.load_loss_state(loss)
        if self.term is not None:
            self.term.load_state_dict(terms.get(self.term_name, {}))
