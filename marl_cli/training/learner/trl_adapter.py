"""The one place marl touches TRL's ``GRPOTrainer``: its construction, the attributes marl reads or sets on it, and
the loss call. ``PolicyTrainer`` talks to ``GRPOAdapter`` only, so a TRL upgrade is this file, and a new loss option
(per-token advantages, an entropy term, a value loss) goes into ``GRPOAdapter.loss``.

Checked against TRL 1.16.0 (``trl==1.16.0`` in pyproject.toml; the range known to work is ``>=1.16.0,<1.17``),
transformers 5.24 and accelerate 1.15. What marl relies on, by name:

- construction: ``GRPOConfig`` (the keywords of ``grpo_args``, ``cast_lm_head_to_fp32``, ``temperature``) and
  ``GRPOTrainer(model=, args=, processing_class=, reward_funcs=, train_dataset=)``; the constructor seeds from
  ``args.seed``, wraps the model's forward with ``trl.trainer.utils.add_fused_lm_head`` (``fused_lm_head=True``
  returns ``log_probs``/``entropy`` of the labels) and builds the ``accelerator``;
- set after construction: ``beta`` (the config gets 0.0, so TRL builds no reference model of its own),
  ``current_gradient_accumulation_steps`` (1: one mini-batch is one optimiser step), ``use_vllm`` and
  ``vllm_importance_sampling_correction`` (on with ``trainer.is_correction``: TRL multiplies the loss by
  ``batch["importance_sampling_ratio"]`` only on its vLLM path);
- read: ``model`` (the learner, after accelerate's preparation), ``optimizer`` and ``lr_scheduler`` (from
  transformers' ``create_optimizer_and_scheduler``), ``accelerator`` (``num_processes``, ``autocast``,
  ``backward``), ``epsilon_low``/``epsilon_high`` (the clip range), ``_metrics["train"]`` (the loss's metrics,
  drained every step), ``args.temperature`` and ``args.cast_lm_head_to_fp32`` (the reference's fused head);
- read with its graph: the entropies ``_get_per_token_logps_and_entropies`` returns in the loss's forward (EPO's
  terms are added to TRL's loss, ``losses/epo.py``);
- read and restored: ``entropy_coef`` and ``_last_world_entropy`` (the adaptive entropy controller's state, which
  TRL's own checkpoints hold as ``entropy_ctrl_state.json``; marl's hold it with the optimiser's);
- called besides the loss: ``get_off_policy_mask`` (the share of tokens the off-policy mask drops, a metric);
- called: ``compute_loss(model, batch)`` (which reads ``loss_type``, ``max_completion_length``,
  ``importance_sampling_level``, ``top_entropy_quantile``, ``off_policy_mask_threshold``,
  ``_entropy_bonus_enabled``, ``args.steps_per_generation``/``delta``/``use_bias_correction_kl``: all from the
  config) and ``_get_per_token_logps_and_entropies`` (overridden below; called for the no-grad scoring too).

The batch ``compute_loss`` reads: ``prompt_ids``/``prompt_mask`` (left-padded), ``completion_ids``/
``completion_mask`` (right-padded), ``advantages`` (one per row, or (B, T): one per completion token),
``num_items_in_batch`` (the token-sum losses' normaliser), ``old_per_token_logps``, and where used
``ref_per_token_logps``, ``importance_sampling_ratio``, ``sampling_per_token_logps`` (the off-policy mask's
reference) and ``tool_mask`` (``LOSS_MASK``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from marl_cli.config.schema import CLIPPED_LOSSES, TrainerConfig, marked
from marl_cli.core.world import World
from marl_cli.rollout.prefix import keeping_cache, shared_prompt_cache
from marl_cli.training.learner.sharding import regathered_prompt
from marl_cli.training.learner.trl_args import GRPOConfig, GRPOTrainer, add_fused_lm_head, checkpointing_off

OWN_METRICS = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
               "clip_ratio/low_min", "clip_ratio/high_max")
"""TRL's metrics of the loss forward that marl computes itself over every row (TRL's see the trained rows only)."""
UPDATE_KEYS = marked(TrainerConfig, "trl", "update")
"""The ``trainer`` keys that go to ``GRPOConfig`` under their own name as its optimiser, schedule and clip."""
LOSS_KNOBS = marked(TrainerConfig, "trl", "loss")
"""The ``trainer`` keys that go to ``GRPOConfig`` under their own name, read by TRL's ``compute_loss`` (but
``mask_truncated_completions``, which TRL applies in its generation loop: marl applies it in its batch,
``LOSS_MASK``)."""
LOSS_MASK = "tool_mask"
"""The batch key of TRL's loss mask beside ``completion_mask`` (TRL's name: it masks tool-output tokens): the loss and
its normalisers count a completion token where both are 1, the forward attends to every completion token. marl zeroes
the rows of truncated completions there (``trainer.mask_truncated_completions``)."""


def grpo_args(trainer_cfg: Any, temperature: float, max_completion_length: int, output_dir: Path, seed: int,
              device: torch.device, autocast_dtype: torch.dtype | None) -> GRPOConfig:
    """TRL's config for the update of a policy on ``device`` computing under ``autocast_dtype``: the ``trainer``
    config's optimiser and loss settings; β = 0 (marl supplies the reference log-probs itself, the policy at the
    start of RL; ``GRPOAdapter`` sets TRL's β afterwards); ``LOSS_KNOBS`` as given; log-probs at the rollout
    ``temperature``; no logging, saving or checkpointing by TRL."""
    return GRPOConfig(
        output_dir=str(output_dir),
        **{key: getattr(trainer_cfg, key) for key in UPDATE_KEYS},
        beta=0.0,
        temperature=temperature if temperature > 0 else 1.0,
        max_completion_length=max_completion_length,
        num_generations=2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        max_steps=max(trainer_cfg.steps, 1),
        **{key: getattr(trainer_cfg, key) for key in LOSS_KNOBS},
        **checkpointing_off(),  # switched on by marl, on the model itself
        use_cpu=device.type == "cpu",
        bf16=autocast_dtype == torch.bfloat16,
        fp16=autocast_dtype == torch.float16,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        seed=seed,
        disable_tqdm=True,
    )


def loss_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The completion tokens TRL's loss counts (its ``mask``): ``completion_mask``, times ``LOSS_MASK`` where given."""
    mask = batch["completion_mask"]
    return mask * batch[LOSS_MASK] if LOSS_MASK in batch else mask


def importance_ratio(new: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """TRL's PPO ratio before clipping, on every completion token: exp(``new`` − ``old``) per token, or with
    ``level="sequence"`` (GSPO) exp of the row's mean log-ratio over ``mask``, the same on each of its tokens."""
    log_ratio = new - old
    if level == "sequence":
        mean = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        log_ratio = mean.expand_as(new)
    return torch.exp(log_ratio)


def add_sampler_logps(batch: dict[str, torch.Tensor], old: torch.Tensor) -> None:
    """Give ``batch`` the log-probs TRL's off-policy mask measures the drift from (``sampling_per_token_logps``):
    the sampler's (``sampling_logps``) where the generator gave them, else the old policy's ``old``."""
    batch["sampling_per_token_logps"] = torch.where(batch["sampling_mask"].bool(), batch["sampling_logps"], old)


def shared_prompt_forward(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                          entropy: bool, autocast: Any,
                          always: bool = False) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` tokens of each row (the completion),
    each distinct prompt running once (``shared_prompt_cache``, ``always`` as there), scored by TRL's fused head
    as its own forward scores them: the same numbers up to float rounding; gradients flow through the cache's
    copies back to the shared prompt pass (on an FSDP2-sharded learner too: ``regathered_prompt``). None where
    ``shared_prompt_cache`` is (the caller then runs TRL's forward)."""
    width = input_ids.size(1) - logits_to_keep
    with autocast(), keeping_cache(model):
        with regathered_prompt(model):
            cache = shared_prompt_cache(model, input_ids[:, :width], attention_mask[:, :width], always,
                                        replayable=True)
        if cache is None:
            return None
        tail = input_ids[:, width - 1:]
        labels = tail.masked_fill(attention_mask[:, width - 1:] == 0, -100)
        labels[:, 0] = -100
        out = model(input_ids=tail, attention_mask=attention_mask, labels=labels, fused_lm_head=True, **cache)
    return out.log_probs, (out.entropy if entropy else None)


class _GRPOLoss(GRPOTrainer):
    """TRL's GRPOTrainer, remembering the per-token log-probs of its last forward (for the KL to the old policy)
    and running a prompt that several rows share once."""

    last_logps: torch.Tensor | None = None
    last_entropies: torch.Tensor | None = None
    """The per-token entropies of the last forward (None where it computed none): with their graph under
    ``keep_entropies``, else detached."""
    keep_entropies: bool = False
    sharded: Any = None
    """The FSDP2-sharded learner, if any: its forwards are collective, so every rank takes the same path."""
    world: World = World()

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                           logits_to_keep: int, batch_size: int | None = None,
                                           compute_entropy: bool = False, **kwargs: Any) -> Any:
        """TRL's, except that rows sharing a prompt share its forward pass (``shared_prompt_forward``; text-only
        inputs without TRL's MoE auxiliary loss, unchunked)."""
        shared = None
        if (batch_size is None or batch_size >= len(input_ids)) and \
                not any(value is not None and value is not False for value in kwargs.values()):
            # sharded, each rank's forward gathers every layer's weights with the others': all ranks run their
            # prompts ahead (shared or not), or none does (a prompt one token wide)
            collective = model is self.sharded
            if not collective or all(self.world.gather(input_ids.size(1) - logits_to_keep >= 2)):
                shared = shared_prompt_forward(model, input_ids, attention_mask, logits_to_keep, compute_entropy,
                                               self.accelerator.autocast, always=collective)
        if shared is not None:
            out = (*shared, None)
        else:
            out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                             batch_size, compute_entropy, **kwargs)
        self.last_logps = out[0].detach()
        self.last_entropies = out[1] if self.keep_entropies or out[1] is None else out[1].detach()
        return out


class GRPOAdapter:
    """TRL's GRPO trainer for one policy's update, through the few operations marl uses.

    Args:
        model: the module to train (the learner; sharded under ``trainer.sharding=fsdp2``).
        tokenizer: the policy's tokenizer (TRL's ``processing_class``).
        args: TRL's config (``grpo_args``).
        trainer_cfg: the ``trainer`` config (β, ``is_correction``, ``steps``).
        world: the processes the update is split across (TRL's accelerator must see as many).
        sharded: whether ``model`` is FSDP2-sharded across ``world`` (its forwards are then collective).
    """

    def __init__(self, model: Any, tokenizer: Any, args: GRPOConfig, trainer_cfg: Any, world: World,
                 sharded: bool = False):
        self.args = args
        self._forwards: dict[tuple[int, float], Any] = {}
        """Forwards patched at other temperatures than ``args.temperature``, by (module id, temperature)."""
        self.trl = _GRPOLoss(model=model, args=args, processing_class=tokenizer,
                             reward_funcs=[_rewards_come_from_rollouts], train_dataset=_placeholder_prompts())
        self.trl.current_gradient_accumulation_steps = 1
        self.trl.beta = trainer_cfg.beta
        # TRL applies ``batch["importance_sampling_ratio"]`` only on its vLLM path
        self.trl.use_vllm = self.trl.vllm_importance_sampling_correction = trainer_cfg.is_correction != "none"
        if self.trl.accelerator.num_processes != world.size:
            raise RuntimeError(f"TRL sees {self.trl.accelerator.num_processes} processes, marl {world.size}")
        self.trl.create_optimizer_and_scheduler(num_training_steps=max(trainer_cfg.steps, 1))
        if sharded:
            self.trl.sharded, self.trl.world = self.trl.model, world

    @property
    def model(self) -> Any:
        """The module the optimiser trains (as accelerate prepared it)."""
        return self.trl.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.trl.optimizer

    @property
    def scheduler(self) -> Any:
        return self.trl.lr_scheduler

    @property
    def clip_range(self) -> tuple[float, float] | None:
        """(ε_low, ε_high) of the loss's ratio clipping, or None for a loss type that does not clip it."""
        return (self.trl.epsilon_low, self.trl.epsilon_high) if self.args.loss_type in CLIPPED_LOSSES else None

    def keep_entropies(self, keep: bool) -> None:
        """Whether ``last_entropies`` holds the entropies of the loss's forward (a loss term of marl's reads them)."""
        self.trl.keep_entropies = keep

    @property
    def last_entropies(self) -> torch.Tensor | None:
        """The per-token entropies of the last forward: after ``loss``, the learner's (differentiable with
        ``keep_entropies``, else detached)."""
        return self.trl.last_entropies

    @property
    def last_logps(self) -> torch.Tensor | None:
        """The per-token log-probs (detached) of the last forward: after ``loss``, the learner's."""
        return self.trl.last_logps

    def logps(self, model: Any, batch: dict[str, torch.Tensor],
              entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``model``'s per-token log-probs of ``batch``'s completions (and entropies with ``entropy``), scored as
        the loss scores them (at the batch's ``temperature``, else the config's). The caller chooses grad or no grad."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with self.scoring_at(model, batch.get("temperature")):
            logps, entropies, _ = self.trl._get_per_token_logps_and_entropies(
                model, input_ids, mask, batch["completion_ids"].size(1), compute_entropy=entropy)
        return logps, entropies

    def loss(self, model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """TRL's GRPO loss of ``batch`` (see the module's docstring for the keys it reads) under ``model``, its
        log-probs at the batch's ``temperature`` (else the config's)."""
        with self.scoring_at(model, batch.get("temperature")):
            return self.trl.compute_loss(model, batch)

    @contextlib.contextmanager
    def scoring_at(self, model: Any, temperature: float | None) -> Iterator[None]:
        """Within the block ``model``'s fused head divides the logits by ``temperature`` (None, or the config's:
        as TRL patched it). TRL fixes the temperature when it patches a model's forward
        (``add_fused_lm_head``), so a forward patched at each other temperature is made once and swapped in."""
        if temperature is None or temperature <= 0 or temperature == self.args.temperature:
            yield
            return
        target = model.get_base_model() if hasattr(model, "get_base_model") else model
        before = target.__dict__.get("forward")
        key = (id(target), temperature)
        if key not in self._forwards:
            target.__dict__.pop("forward", None)
            add_fused_lm_head(target, temperature=temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                              outputs=("log_probs", "entropy"))
            self._forwards[key] = target.__dict__["forward"]
        target.__dict__["forward"] = self._forwards[key]
        try:
            yield
        finally:
            if before is None:
                target.__dict__.pop("forward")
            else:
                target.__dict__["forward"] = before

    def off_policy_kept(self, batch: dict[str, torch.Tensor], new: torch.Tensor) -> torch.Tensor | None:
        """TRL's off-policy mask of ``batch`` under the learner's log-probs ``new`` (1: kept; (B, 1), or (B, T) with
        per-token advantages), as its loss applies it; None without ``off_policy_mask_threshold``."""
        if self.args.off_policy_mask_threshold is None:
            return None
        advantages = batch["advantages"]
        return self.trl.get_off_policy_mask(advantages.unsqueeze(1) if advantages.dim() == 1 else advantages, new,
                                            batch["sampling_per_token_logps"], loss_mask(batch),
                                            self.args.off_policy_mask_threshold)

    def loss_state(self) -> dict[str, float]:
        """What TRL's loss carries from one optimiser step to the next, as TRL's own checkpoints hold it: the
        adaptive entropy controller's coefficient and last measured entropy (nothing without
        ``use_adaptive_entropy``)."""
        if not self.args.use_adaptive_entropy:
            return {}
        return {"entropy_coef": self.trl.entropy_coef, "last_world_entropy": self.trl._last_world_entropy}

    def load_loss_state(self, state: dict[str, float]) -> None:
        """Continue from ``loss_state``'s (one saved without adaptive entropy control, or empty: as configured)."""
        if self.args.use_adaptive_entropy and state:
            self.trl.entropy_coef = state["entropy_coef"]
            self.trl._last_world_entropy = state["last_world_entropy"]

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` as TRL's accelerator does (loss scaling under fp16)."""
        self.trl.accelerator.backward(loss)

    def drain_metrics(self) -> dict[str, float]:
        """The mean of each metric TRL's loss recorded since the last call (but ``OWN_METRICS``), then forget them."""
        train = self.trl._metrics["train"]
        out = {key: sum(values) / len(values) for key, values in train.items() if values and key not in OWN_METRICS}
        train.clear()
        return out

    def frozen_copy(self, model: Any) -> Any:
        """A frozen copy of ``model`` as it is now (the KL reference), scoring tokens as the learner does."""
        reference = copy.deepcopy(model)
        reference.__dict__.pop("forward", None)  # drop the copied fused-head patch; it is re-added for the copy
        reference.eval().requires_grad_(False)
        if getattr(reference, "is_gradient_checkpointing", False):
            reference.gradient_checkpointing_disable()
        add_fused_lm_head(reference, temperature=self.args.temperature,
                          cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        return reference


def _rewards_come_from_rollouts(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """TRL's constructor requires a reward source; marl's rollout engine scores every sample instead."""
    raise RuntimeError("marl scores samples in its rollout engine; TRL's generation loop must not run")


def _placeholder_prompts() -> Any:
    """TRL's constructor requires a dataset; marl feeds rollouts itself, so this one is never read."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [""]})
