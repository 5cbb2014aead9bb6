import dataclasses
import random
from collections import defaultdict

import pytest
import torch
from omegaconf import OmegaConf
from trl import GRPOTrainer

from marl_cli.config.schema import ModelConfig, PolicyConfig, TrainerConfig
from marl_cli.core.samples import Sample
from marl_cli.policies.regime import attach_adapters, build_policies
from marl_cli.policies.roles import assign_roles
from marl_cli.rollout import prefix
from marl_cli.training.learner.policy_trainer import PolicyTrainer, collate
from tests.policies.test_tiny import SMALL
from tests.precision import after_adam, assert_rounding_close, rounding, to_float64


@pytest.fixture
def policy(tmp_path):
    model_cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    return build_policies({"agent": "shared"}, model_cfg, 0, tmp_path, torch.device("cpu"))["shared"]


def _rows(advantages):
    return [Sample(task=0, branch=i, turn=0, role="agent", policy="shared", prompt_ids=[10, 11, 12][: 1 + i % 3],
                   completion_ids=[20, 21, 1][: 1 + (i + 1) % 3], reward=0.0, advantage=a)
            for i, a in enumerate(advantages)]


def _trainer(policy, tmp_path, **kw):
    cfg = OmegaConf.structured(TrainerConfig(**{"learning_rate": 1e-2, "steps": 10, "mini_batch_size": 2, **kw}))
    return PolicyTrainer(policy, cfg, temperature=0.7, max_completion_length=8, output_dir=tmp_path / "trl", seed=0)


def test_config_passes_through_to_trl(policy, tmp_path):
    t = _trainer(policy, tmp_path, loss_type="dr_grpo", epsilon=0.3, epsilon_high=0.4, beta=0.0)
    assert t.grpo.trl.loss_type == "dr_grpo"
    assert (t.grpo.trl.epsilon_low, t.grpo.trl.epsilon_high) == (0.3, 0.4)
    assert t.grpo.trl.temperature == 0.7  # the loss scores log-probs at the rollout temperature
    assert set(t.scheduler.get_last_lr()) == {1e-2}


def test_update_moves_weights_only_with_nonzero_advantages(policy, tmp_path):
    t = _trainer(policy, tmp_path)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    stats = t.update(_rows([0.0, 0.0, 0.0]), random.Random(0))
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())
    assert stats["rows"] == 3
    stats = t.update(_rows([1.0, -1.0, 0.5]), random.Random(0))
    assert any(not torch.equal(before[k], v) for k, v in policy.model.state_dict().items())
    assert stats["grad_norm"] > 0


def test_positive_advantage_raises_its_likelihood(policy, tmp_path):
    t = _trainer(policy, tmp_path, learning_rate=5e-3)
    rows = _rows([1.0, -1.0])
    batch = collate(rows, policy.tokenizer.pad_token_id, torch.device("cpu"))
    before = (t._logps(policy.model, batch) * batch["completion_mask"]).sum(1)
    for _ in range(5):
        t.update(rows, random.Random(0))
    after = (t._logps(policy.model, batch) * batch["completion_mask"]).sum(1)
    assert after[0] > before[0] and after[1] < before[1]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"])
def test_every_loss_type_trains(policy, tmp_path, loss_type):
    t = _trainer(policy, tmp_path, loss_type=loss_type, epsilon_high=5.0 if loss_type == "cispo" else None)
    before = policy.model.model.embed_tokens.weight.clone()
    stats = t.update(_rows([1.0, -1.0, 0.5]), random.Random(0))
    assert stats["loss"] == stats["loss"] and stats["grad_norm"] > 0
    assert not torch.equal(before, policy.model.model.embed_tokens.weight)


def test_filtered_rows_are_not_trained(policy, tmp_path):
    t = _trainer(policy, tmp_path)
    rows = _rows([1.0, -1.0])
    for r in rows:
        r.keep = False
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    stats = t.update(rows, random.Random(0))
    assert stats["rows"] == 0 and stats["dropped_rows"] == 2
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())


def test_state_round_trip(policy, tmp_path):
    t = _trainer(policy, tmp_path, lr_scheduler_type="linear")
    t.update(_rows([1.0, -1.0]), random.Random(0))
    state = t.state_dict()
    fresh = _trainer(policy, tmp_path, lr_scheduler_type="linear")
    fresh.load_state_dict(state)
    assert fresh.scheduler.get_last_lr() == t.scheduler.get_last_lr()
    assert max(t.scheduler.get_last_lr()) < 1e-2


def test_collate_pads_prompts_left_and_completions_right():
    batch = collate(_rows([0.5, 0.0, -0.5]), pad_id=0, device=torch.device("cpu"))
    assert batch["prompt_ids"].tolist() == [[0, 0, 10], [0, 10, 11], [10, 11, 12]]
    assert batch["completion_ids"].tolist() == [[20, 21, 0], [20, 21, 1], [20, 0, 0]]
    assert batch["completion_mask"].tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert batch["advantages"].tolist() == [0.5, 0.0, -0.5]
    assert batch["num_items_in_batch"].item() == 6


def test_role_map():
    shared = OmegaConf.create({"name": "shared", "assignment": {}})
    per_role = OmegaConf.create({"name": "per_role", "assignment": {"c": "a"}})
    assert assign_roles(shared, ["a", "b"]) == {"a": "shared", "b": "shared"}
    assert assign_roles(per_role, ["a", "b", "c"]) == {"a": "a", "b": "b", "c": "a"}
    with pytest.raises(ValueError, match="policy.assignment"):
        assign_roles(OmegaConf.create({"name": "shared", "assignment": {"zz": "x"}}), ["a"])
    with pytest.raises(ValueError, match="policy.name"):
        assign_roles(OmegaConf.create({"name": "bogus", "assignment": {}}), ["a"])


@pytest.mark.parametrize("mode,shift,factor", [
    ("token_truncate", 0.0, 1.0),  # sampler = learner: weight 1, the loss is unchanged
    ("token_truncate", 5.0, 3.0),  # weight 5 truncated to is_clip_max = 3
    ("token_mask", 5.0, 0.0),  # weight 5 outside [0, 3]: masked out
    ("sequence_truncate", 1.1, None),  # per sequence: exp(1.1 × its tokens), truncated to 3
])
def test_importance_sampling_correction_weights_the_loss_as_trl_defines_it(policy, tmp_path, mode, shift, factor):
    plain = _trainer(policy, tmp_path / "plain", mini_batch_size=64)
    corrected = _trainer(policy, tmp_path / "is", mini_batch_size=64, is_correction=mode, is_clip_max=3.0)
    rows = _rows([1.0, -1.0, 0.5])
    learner = plain._logps(policy.model, collate(rows, policy.tokenizer.pad_token_id, torch.device("cpu")))
    for i, row in enumerate(rows):  # the sampler's log-probs: the learner's minus log(shift) per token
        row.sampling_logprobs = (learner[i, :len(row.completion_ids)] - (torch.tensor(shift).log() if shift else 0.0)
                                 ).tolist()
    losses, stats = [], {}
    for trainer in (plain, corrected):
        batch = collate(rows, policy.tokenizer.pad_token_id, torch.device("cpu"))
        stats = defaultdict(list)
        trainer._prepare(batch, stats)
        losses.append(trainer.grpo.loss(trainer.model, batch).item())
    if factor is not None:
        assert losses[1] == pytest.approx(factor * losses[0], abs=1e-6)
        assert stats["is_ratio/max"][0] == pytest.approx(factor, abs=1e-6)
    else:
        lengths = [len(r.completion_ids) for r in rows]
        assert stats["is_ratio/max"][0] == pytest.approx(min(3.0, 1.1 ** max(lengths)), rel=1e-5)
        assert losses[1] != pytest.approx(losses[0])


TERMS = 20_000
"""An upper bound on the terms any entry of these tests' gradients (or statistics) accumulates: ≤ 12 rows ×
≤ 17 positions × widths ≤ 64 (SMALL: hidden 32, intermediate 64, vocab ~100 at the output)."""


def _mixed_rows(step):
    """Rows of varied lengths, a third of them with advantage 0, one mini-batch (of 3) all zero."""
    gen = random.Random(step)
    advantages = [gen.uniform(-1, 1) if i % 3 else 0.0 for i in range(9)] + [0.0, 0.0, 0.0]
    return [Sample(task=i // 3, branch=i % 3, turn=0, role="agent", policy="shared",
                   prompt_ids=[gen.randrange(3, 60) for _ in range(gen.randint(2, 9))],
                   completion_ids=[gen.randrange(3, 60) for _ in range(gen.randint(1, 8))],
                   reward=0.0, advantage=a) for i, a in enumerate(advantages)]


@pytest.mark.parametrize("loss_type", ["bnpo", "grpo", "dr_grpo", "dapo", "cispo", "sapo"])
def test_skipping_zero_advantage_rows_gives_the_same_update(tmp_path, monkeypatch, loss_type):
    """In float64 (``to_float64``): the skipped mini-batches are cut to their own widths, so their tokens sit at
    other positions and sum in another order, and Adam can turn float32's noise in a cancelling gradient entry
    into a whole step (cispo: 7.9e-6 apart in float32 on an AMD EPYC; 2e-16 in float64). Weights: ``after_adam``
    (lr 5e-3, 3 steps, ``TERMS``: 6.7e-6; dropping one trained row moves a weight by 0.07). Statistics: float64
    rounding of ``TERMS`` terms (4.4e-12 relative) — Adam's amplification reaches only entries whose gradient is
    within rounding of 0, which the loss does not depend on to first order (a 1% loss weight shows here)."""
    results = {}
    for skip in (False, True):
        model_cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
        policy = build_policies({"agent": "shared"}, model_cfg, 0, tmp_path / str(skip), torch.device("cpu"))["shared"]
        t = _trainer(to_float64(policy, monkeypatch), tmp_path / str(skip), loss_type=loss_type, mini_batch_size=3,
                     learning_rate=5e-3, skip_zero_advantage=skip)
        seen = []

        def spy(model, batch, compute_loss=t.grpo.trl.compute_loss, seen=seen):
            seen.append(len(batch["advantages"]))
            return compute_loss(model, batch)

        t.grpo.trl.compute_loss = spy
        stats = [t.update(_mixed_rows(step), random.Random(step)) for step in range(3)]
        results[skip] = ({k: v.clone() for k, v in policy.model.state_dict().items()}, stats, seen)
    (full, full_stats, full_seen), (skipped, skip_stats, skip_seen) = results[False], results[True]
    assert sum(full_seen) == 36 and sum(skip_seen) == 3 * (6 + 1)  # 6 rows with a gradient, 1 copy for the zero batch
    for key, value in full.items():
        torch.testing.assert_close(skipped[key], value, atol=after_adam(5e-3, 3, TERMS), rtol=0, msg=key)
    for one, other in zip(full_stats, skip_stats, strict=True):
        for key in ("loss", "grad_norm", "entropy", "clip_ratio/region_mean", "clip_ratio/low_mean"):
            if key in one:
                assert other[key] == pytest.approx(one[key], rel=rounding(TERMS), abs=rounding(TERMS)), key
        assert one["trained_row_fraction"] == 1.0 and other["trained_row_fraction"] < 0.6
    assert any(s.get("clip_ratio/region_mean", 1) > 0 for s in full_stats)  # ratios leave [0.8, 1.2]


def test_with_a_kl_penalty_every_row_is_trained(policy, tmp_path):
    t = _trainer(policy, tmp_path, beta=0.1, mini_batch_size=12)
    assert t.update(_mixed_rows(0), random.Random(0))["trained_row_fraction"] == 1.0


def _grouped_rows(seed):
    """Groups of rows sharing a prompt (K samples of one task), prompts and completions of varied lengths."""
    gen = random.Random(seed)
    prompts = [[gen.randrange(3, 60) for _ in range(gen.randint(2, 9))] for _ in range(3)]
    return [Sample(task=i // 4, branch=i % 4, turn=0, role="agent", policy="shared", prompt_ids=prompts[i // 4],
                   completion_ids=[gen.randrange(3, 60) for _ in range(gen.randint(1, 8))], reward=0.0,
                   advantage=gen.uniform(-1, 1)) for i in range(12)]


def _plain(t, model, batch, entropy=False):
    """TRL's own forward over every row (no prompt sharing)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return GRPOTrainer._get_per_token_logps_and_entropies(t.grpo.trl, model, input_ids, mask,
                                                          batch["completion_ids"].size(1), compute_entropy=entropy)


@pytest.mark.parametrize("regime", ["shared", "lora_per_role"])
def test_rows_sharing_a_prompt_score_as_trls_forward_does(tmp_path, monkeypatch, regime):
    """In float64 at float64's rounding of ``TERMS`` terms: the shared prompt runs as a cache, the plain forward
    as one sequence, two float orders of the same sums."""
    model_cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    roles = {"agent": "agent", "other": "other"}
    policy = build_policies(roles, model_cfg, 0, tmp_path, torch.device("cpu"), regime=regime)
    policy = next(iter(policy.values()))
    if regime == "lora_per_role":
        policy = attach_adapters(policy, roles, OmegaConf.structured(PolicyConfig(name=regime)), tmp_path)["agent"]
        with torch.no_grad():  # adapters start as the identity: give this one weights of its own
            for name, param in policy.model.named_parameters():
                if "lora_B.agent" in name:
                    param.normal_(0, 0.1)
    t = _trainer(to_float64(policy, monkeypatch), tmp_path)
    policy.activate()
    batch = collate(_grouped_rows(0), policy.tokenizer.pad_token_id, torch.device("cpu"))
    calls = []
    model = t.model
    original = model.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape)
        return original(*args, **kwargs)

    model.forward = counting
    shared_logps, shared_entropy = t._forward(model, batch, entropy=True)
    model.forward = original
    assert calls[0][0] == 3 and calls[1][0] == 12  # the three prompts once, then every row's completion
    with torch.no_grad():
        logps, entropy, _ = _plain(t, model, batch, entropy=True)
    assert_rounding_close(shared_logps, logps, TERMS)
    assert_rounding_close(shared_entropy, entropy, TERMS)
    assert (shared_logps[batch["completion_mask"] == 0] == 0).all()


def test_the_loss_through_a_shared_prompt_has_trls_gradient(policy, tmp_path, monkeypatch):
    """In float64 at float64's rounding of ``TERMS`` terms (two float orders of the same gradient)."""
    t = _trainer(to_float64(policy, monkeypatch), tmp_path)
    batch = collate(_grouped_rows(2), policy.tokenizer.pad_token_id, torch.device("cpu"))
    t._prepare(batch, defaultdict(list))
    grads = {}
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr("marl_cli.training.learner.trl_adapter.shared_prompt_forward", lambda *a, **k: None)
        t.model.train()
        t.model.zero_grad()
        t.grpo.loss(t.model, batch).backward()
        grads[shared] = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
    assert grads[True].keys() == grads[False].keys() and grads[True]
    for name, grad in grads[False].items():
        assert_rounding_close(grads[True][name], grad, TERMS, name)


@pytest.mark.parametrize("regime", ["shared", "lora_per_role"])
def test_under_gradient_checkpointing_a_shared_prompt_runs_once_with_trls_gradient(tmp_path, monkeypatch, regime):
    """Checkpointed layers keep the learner's cache and replay it in the backward (each cache layer written twice:
    the forward, then the replay, which writes the same keys); log-probs and gradient are TRL's checkpointed ones
    (in float64, at float64's rounding of ``TERMS`` terms)."""
    model_cfg = OmegaConf.structured(ModelConfig(tiny=dataclasses.replace(SMALL, num_hidden_layers=2)))
    roles = {"agent": "agent", "other": "other"}
    policy = next(iter(build_policies(roles, model_cfg, 0, tmp_path, torch.device("cpu"), regime=regime).values()))
    if regime == "lora_per_role":
        policy = attach_adapters(policy, roles, OmegaConf.structured(PolicyConfig(name=regime)), tmp_path)["agent"]
    t = _trainer(to_float64(policy, monkeypatch), tmp_path, gradient_checkpointing=True)
    batch = collate(_grouped_rows(2), policy.tokenizer.pad_token_id, torch.device("cpu"))
    t._prepare(batch, defaultdict(list))
    t.model.train()
    with torch.no_grad():
        plain, _, _ = _plain(t, t.model, batch)
    assert_rounding_close(batch["old_per_token_logps"], plain, TERMS)
    writes = []
    for layer in (prefix._PromptLayer, prefix._PrefixLayer):
        update = layer.update
        monkeypatch.setattr(layer, "update", lambda self, *a, _u=update, _n=layer.__name__, **k:
                            writes.append(_n) or _u(self, *a, **k))
    grads = {}
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr("marl_cli.training.learner.trl_adapter.shared_prompt_forward", lambda *a, **k: None)
        t.model.zero_grad()
        t.grpo.loss(t.model, batch).backward()
        grads[shared] = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
        if shared:
            assert sorted(writes) == ["_PrefixLayer"] * 4 + ["_PromptLayer"] * 4  # 2 layers × (forward + replay)
    assert grads[True].keys() == grads[False].keys() and grads[True]
    for name, grad in grads[False].items():
        assert_rounding_close(grads[True][name], grad, TERMS, name)
