"""The adapter to TRL's GRPOTrainer (``training/learner/trl_adapter.py``): what it passes to TRL, what it sets on TRL's
trainer, and that each of its operations is TRL's own."""

import pytest
import torch
from omegaconf import OmegaConf
from trl import GRPOTrainer

from marl_cli.config.schema import ModelConfig, TrainerConfig
from marl_cli.core.samples import Sample
from marl_cli.core.world import World
from marl_cli.policies.regime import build_policies
from marl_cli.training.learner.policy_trainer import collate
from marl_cli.training.learner.trl_adapter import (
    CLIPPED_LOSSES,
    OWN_METRICS,
    GRPOAdapter,
    _rewards_come_from_rollouts,
    grpo_args,
)
from tests.policies.test_tiny import SMALL


@pytest.fixture
def policy(tmp_path):
    model_cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    return build_policies({"agent": "shared"}, model_cfg, 0, tmp_path, torch.device("cpu"))["shared"]


def _cfg(**kw):
    return OmegaConf.structured(TrainerConfig(**{"learning_rate": 1e-2, "steps": 10, **kw}))


def _adapter(policy, tmp_path, temperature=0.7, world=None, **kw):
    cfg = _cfg(**kw)
    args = grpo_args(cfg, temperature, 8, tmp_path / "trl", 0, policy.model.device, policy.autocast_dtype)
    return GRPOAdapter(policy.model, policy.tokenizer, args, cfg, world or World())


def _batch(policy, advantages=(1.0, -0.5, 0.0)):
    rows = [Sample(task=0, branch=i, turn=0, role="agent", policy="shared", prompt_ids=[10, 11, 12][: 1 + i % 3],
                   completion_ids=[20, 21, 22, 1][: 2 + i % 3], reward=0.0, advantage=a)
            for i, a in enumerate(advantages)]
    return collate(rows, policy.tokenizer.pad_token_id, torch.device("cpu"))


def test_grpo_args_carry_the_trainer_config_and_switch_trls_own_machinery_off(tmp_path):
    cfg = _cfg(loss_type="dapo", epsilon=0.25, epsilon_high=0.3, beta=0.1, num_iterations=2, steps=0,
               max_grad_norm=0.5, warmup_steps=3, weight_decay=0.01, lr_scheduler_type="linear")
    args = grpo_args(cfg, 0.0, 24, tmp_path, 5, torch.device("cpu"), torch.bfloat16)
    assert (args.loss_type, args.epsilon, args.epsilon_high, args.num_iterations) == ("dapo", 0.25, 0.3, 2)
    assert (args.learning_rate, args.max_grad_norm, args.warmup_steps, args.weight_decay) == (1e-2, 0.5, 3, 0.01)
    assert args.beta == 0.0  # TRL builds no reference model: marl supplies the reference log-probs
    assert args.temperature == 1.0  # greedy rollouts are scored at temperature 1
    assert (args.max_completion_length, args.max_steps, args.seed) == (24, 1, 5)
    assert args.use_cpu and args.bf16 and not args.fp16
    assert not args.gradient_checkpointing and args.report_to in ([], "none", ["none"])
    assert (args.save_strategy, args.logging_strategy) == ("no", "no")
    assert grpo_args(cfg, 0.7, 24, tmp_path, 5, torch.device("cpu"), None).temperature == 0.7


@pytest.mark.parametrize("correction", ["none", "token_truncate"])
def test_the_adapter_sets_what_trls_config_cannot(policy, tmp_path, correction):
    adapter = _adapter(policy, tmp_path, beta=0.04, is_correction=correction)
    assert adapter.trl.beta == 0.04
    assert adapter.trl.current_gradient_accumulation_steps == 1
    assert adapter.trl.use_vllm is adapter.trl.vllm_importance_sampling_correction is (correction != "none")
    assert adapter.model is adapter.trl.model
    assert adapter.optimizer is adapter.trl.optimizer and adapter.scheduler is adapter.trl.lr_scheduler
    trained = {id(p) for group in adapter.optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in policy.model.parameters() if p.requires_grad}
    assert set(adapter.scheduler.get_last_lr()) == {1e-2}  # one per parameter group (decay, no decay)


def test_a_world_trl_does_not_see_is_refused(policy, tmp_path):
    with pytest.raises(RuntimeError, match="TRL sees 1 processes, marl 2"):
        _adapter(policy, tmp_path, world=World(0, 2))


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "cispo", "sapo"])
def test_clip_range_is_trls_for_the_clipped_losses_only(policy, tmp_path, loss_type):
    adapter = _adapter(policy, tmp_path, loss_type=loss_type, epsilon=0.2, epsilon_high=0.28)
    expected = (0.2, 0.28) if loss_type in CLIPPED_LOSSES else None
    assert adapter.clip_range == expected


def test_logps_are_trls_forward_at_the_rollout_temperature(policy, tmp_path):
    adapter = _adapter(policy, tmp_path)
    batch = _batch(policy)
    with torch.no_grad():
        logps, entropies = adapter.logps(policy.model, batch, entropy=True)
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        plain, plain_entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            adapter.trl, policy.model, input_ids, mask, batch["completion_ids"].size(1), compute_entropy=True)
    assert logps.shape == batch["completion_ids"].shape and entropies.shape == logps.shape
    torch.testing.assert_close(logps, plain)
    torch.testing.assert_close(entropies, plain_entropies)
    assert torch.equal(adapter.last_logps, logps)
    assert adapter.logps(policy.model, batch)[1] is None


def test_loss_is_trls_and_its_metrics_are_drained_once(policy, tmp_path):
    adapter = _adapter(policy, tmp_path, is_correction="token_truncate")
    batch = _batch(policy)
    with torch.no_grad():
        batch["old_per_token_logps"] = adapter.logps(policy.model, batch)[0]
    batch["importance_sampling_ratio"] = torch.ones_like(batch["old_per_token_logps"])
    policy.model.train()
    loss = adapter.loss(policy.model, batch)
    assert torch.equal(loss, adapter.trl.compute_loss(policy.model, batch))
    adapter.backward(loss)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.model.parameters())
    adapter.trl._metrics["train"]["entropy"].append(1.0)  # one marl computes itself
    adapter.trl._metrics["train"]["some/metric"] += [1.0, 3.0]
    metrics = adapter.drain_metrics()
    assert metrics["some/metric"] == 2.0
    assert not set(metrics) & set(OWN_METRICS)
    assert adapter.drain_metrics() == {}


def test_frozen_copy_scores_as_the_model_and_stays_put(policy, tmp_path):
    adapter = _adapter(policy, tmp_path)
    reference = adapter.frozen_copy(policy.model)
    assert all(not p.requires_grad for p in reference.parameters())
    assert not reference.training
    batch = _batch(policy)
    policy.model.eval()
    with torch.no_grad():
        assert torch.equal(adapter.logps(reference, batch)[0], adapter.logps(policy.model, batch)[0])
        next(policy.model.parameters()).add_(1.0)
    assert not torch.equal(next(policy.model.parameters()), next(reference.parameters()))


def test_trls_generation_loop_must_not_run():
    with pytest.raises(RuntimeError, match="rollout engine"):
        _rewards_come_from_rollouts(["p"], ["c"])
