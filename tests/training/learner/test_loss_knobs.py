"""TRL 1.16's loss knobs under ``trainer.*``: GSPO's sequence-level ratio, the two-sided clip, the entropy bonus and
its adaptive control, the top-entropy quantile, masking truncated completions and the off-policy mask. Each reaches
TRL's loss (marl's loss of a batch is TRL's own ``compute_loss``, TRL configured with the knob directly), does what
it says on a hand-computed case, and keeps marl's update exact (rows skipped or not; checkpoints)."""

import copy
import math
import random
from collections import defaultdict

import pytest
import torch
from datasets import Dataset
from omegaconf import OmegaConf
from trl import GRPOConfig, GRPOTrainer

from marl_cli.config.schema import ModelConfig, TrainerConfig
from marl_cli.core.samples import Sample
from marl_cli.policies.regime import build_policies
from marl_cli.training.learner.policy_trainer import PolicyTrainer, collate, reads_whole_batch, with_gradient
from marl_cli.training.learner.trl_adapter import LOSS_KNOBS, LOSS_MASK, grpo_args, importance_ratio
from marl_cli.training.learner.trl_args import checkpointing_off
from tests.policies.test_tiny import SMALL
from tests.precision import after_adam, assert_rounding_close, to_float64
from tests.training.learner.test_policy_trainer import TERMS, _mixed_rows

KNOBS = {"importance_sampling_level": "sequence", "delta": 4.0, "entropy_coef": 0.01, "use_adaptive_entropy": True,
         "entropy_target": 0.3, "entropy_coef_delta": 0.002, "entropy_coef_min": 0.001, "entropy_coef_max": 0.2,
         "top_entropy_quantile": 0.2, "mask_truncated_completions": True, "off_policy_mask_threshold": 0.5}
"""A value other than the default for every knob."""


def _policy(tmp_path):
    model_cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    return build_policies({"agent": "shared"}, model_cfg, 0, tmp_path, torch.device("cpu"))["shared"]


@pytest.fixture
def policy(tmp_path):
    return _policy(tmp_path)


def _trainer(policy, tmp_path, **kw):
    cfg = OmegaConf.structured(TrainerConfig(**{"learning_rate": 1e-2, "steps": 10, "mini_batch_size": 64, **kw}))
    return PolicyTrainer(policy, cfg, temperature=0.7, max_completion_length=8, output_dir=tmp_path / "trl", seed=0)


def _rows(advantages=(1.0, -0.5, 0.8, -1.0), finished=(True, True, False, True)):
    return [Sample(task=0, branch=i, turn=0, role="agent", policy="shared", prompt_ids=[10, 11, 12, 13][: 1 + i],
                   completion_ids=[20, 21, 22, 23, 1][: 2 + i % 4], reward=0.0, advantage=a, finished=done)
            for i, (a, done) in enumerate(zip(advantages, finished, strict=True))]


def _prepared(trainer, rows, shift=None):
    """``rows`` collated and prepared as marl's update prepares them, the old log-probs then moved by ``shift``
    (default: a fixed pattern of ±0.5 and ±1.2 nats, so that ratios leave the clip range)."""
    batch = collate(rows, trainer.policy.tokenizer.pad_token_id, torch.device("cpu"),
                    trainer.cfg.mask_truncated_completions)
    trainer._prepare(batch, defaultdict(list))
    if shift is None:
        pattern = torch.tensor([0.5, -1.2, 1.2, -0.5, 0.3])
        shift = pattern.roll(1)[None, :].repeat(len(rows), 1)[:, :batch["completion_ids"].size(1)]
        shift = shift * torch.tensor([1.0, -1.0, 1.0, -1.0])[: len(rows), None]
    batch["old_per_token_logps"] = batch["old_per_token_logps"] - shift * batch["completion_mask"]
    return batch


def _trls_own(policy, tmp_path, **knobs):
    """TRL's GRPOTrainer, on a copy of ``policy``'s model, configured with ``knobs`` directly (not through marl's
    config) and run as marl runs it (one mini-batch per optimiser step)."""
    model = copy.deepcopy(policy.model)
    model.__dict__.pop("forward", None)  # TRL patches the copy's forward itself
    args = GRPOConfig(output_dir=str(tmp_path / "own"), use_cpu=True, bf16=False, report_to="none", temperature=0.7,
                      max_completion_length=8, num_generations=2, per_device_train_batch_size=2, **checkpointing_off(),
                      **{"loss_type": "grpo", **knobs})  # TRL's default loss is dapo, marl's grpo
    own = GRPOTrainer(model=model, args=args, processing_class=policy.tokenizer, reward_funcs=[lambda **kw: [0.0]],
                      train_dataset=Dataset.from_dict({"prompt": [""]}))
    own.current_gradient_accumulation_steps = 1
    own.model.train()
    return own


def _as_trl_builds_it(batch, rows):
    """``batch`` as TRL's generation loop builds it under ``mask_truncated_completions``: the truncated rows'
    ``completion_mask`` zeroed (for attention too), the token count without them."""
    out = {k: v for k, v in batch.items() if k != LOSS_MASK}
    if LOSS_MASK in batch:
        finished = torch.tensor([r.finished for r in rows])
        out["completion_mask"] = batch["completion_mask"] * finished[:, None]
        out["num_items_in_batch"] = out["completion_mask"].sum()
    return out


def test_every_knob_goes_to_trls_config_and_trainer(policy, tmp_path):
    cfg = OmegaConf.structured(TrainerConfig(**KNOBS))
    args = grpo_args(cfg, 0.7, 8, tmp_path, 0, torch.device("cpu"), None)
    assert {key: getattr(args, key) for key in LOSS_KNOBS} == KNOBS
    assert set(LOSS_KNOBS) == set(KNOBS)
    trl = _trainer(policy, tmp_path, **KNOBS).grpo.trl
    assert (trl.importance_sampling_level, trl.top_entropy_quantile, trl.off_policy_mask_threshold) == (
        "sequence", 0.2, 0.5)
    assert (trl.entropy_coef, trl.use_adaptive_entropy, trl._entropy_bonus_enabled) == (0.01, True, True)


CASES = {
    "gspo": {"importance_sampling_level": "sequence"},
    "gspo_luspo": {"importance_sampling_level": "sequence", "loss_type": "luspo"},
    "two_sided_clip": {"delta": 1.5},
    "truncated_dapo": {"mask_truncated_completions": True, "loss_type": "dapo"},
    "truncated_bnpo": {"mask_truncated_completions": True, "loss_type": "bnpo"},
    "truncated_grpo": {"mask_truncated_completions": True},
    "off_policy": {"off_policy_mask_threshold": 0.3},
    "entropy": {"entropy_coef": 0.05, "top_entropy_quantile": 0.5},
}


@pytest.mark.parametrize("knobs", CASES.values(), ids=CASES)
def test_marls_loss_is_trls_own_with_the_knob(policy, tmp_path, knobs):
    rows = _rows()
    rows[3].sampling_logprobs = [0.0] * len(rows[3].completion_ids)  # a negative-advantage row far off-policy
    marl = _trainer(policy, tmp_path, **knobs)
    batch = _prepared(marl, rows)
    own = _trls_own(policy, tmp_path, **knobs)
    policy.model.train()
    loss = marl.grpo.loss(marl.learner, batch)
    torch.testing.assert_close(loss, own.compute_loss(own.model, _as_trl_builds_it(batch, rows)))
    without = _trainer(policy, tmp_path / "plain", loss_type=knobs.get("loss_type", "grpo"))
    assert abs(loss.item() - without.grpo.loss(without.learner, _prepared(without, rows)).item()) > 1e-4


def test_adaptive_entropy_control_is_trls(policy, tmp_path):
    knobs = {"use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_coef_delta": 0.02, "entropy_target": 10.0}
    marl, own = _trainer(policy, tmp_path, **knobs), _trls_own(policy, tmp_path, **knobs)
    batch = _prepared(marl, _rows())
    policy.model.train()
    for _ in range(3):  # no bonus before the first measurement; the coefficient then grows (entropy < target)
        torch.testing.assert_close(marl.grpo.loss(marl.learner, batch), own.compute_loss(own.model, batch))
    assert marl.grpo.trl.entropy_coef == own.entropy_coef == pytest.approx(0.07)


def test_gspo_takes_one_ratio_per_sequence(policy, tmp_path):
    """GSPO: s = exp(mean of the token log-ratios), loss = mean over rows of −min(s·A, clip(s, 1 ± ε)·A)."""
    t = _trainer(policy, tmp_path, importance_sampling_level="sequence")
    rows = _rows(finished=(True,) * 4)
    batch = _prepared(t, rows)
    with torch.no_grad():
        new = t.grpo.logps(t.learner, batch)[0]
    mask = batch["completion_mask"]
    s = torch.exp(((new - batch["old_per_token_logps"]) * mask).sum(1) / mask.sum(1))
    advantages = batch["advantages"]
    expected = -torch.minimum(s * advantages, s.clamp(0.8, 1.2) * advantages).mean()
    torch.testing.assert_close(t.grpo.loss(t.learner, batch), expected)
    torch.testing.assert_close(importance_ratio(new, batch["old_per_token_logps"], mask, "sequence")[:, 0], s)


def test_the_two_sided_clip_caps_a_negative_advantage_ratio_at_delta(policy, tmp_path):
    """One row, A = −1, token ratios (3, 1, 1): the first token's term is δ = 2 (without δ: 3)."""
    t = _trainer(policy, tmp_path, delta=2.0)
    row = _rows(advantages=(-1.0,), finished=(True,))
    shift = torch.tensor([[math.log(3.0), 0.0]])
    batch = _prepared(t, row, shift)
    assert torch.equal(batch["completion_mask"], torch.ones(1, 2, dtype=batch["completion_mask"].dtype))
    assert t.grpo.loss(t.learner, batch).item() == pytest.approx((2.0 + 1.0) / 2, rel=1e-5)
    unclipped = _trainer(policy, tmp_path / "plain")
    assert unclipped.grpo.loss(unclipped.learner, _prepared(unclipped, row, shift)).item() == pytest.approx(
        (3.0 + 1.0) / 2, rel=1e-5)


def test_a_truncated_completion_is_left_out_of_the_loss_and_its_normaliser(policy, tmp_path):
    rows = _rows()
    finished = [r for r in rows if r.finished]
    for loss_type, share in (("dapo", 1.0), ("bnpo", 1.0), ("grpo", 3 / 4)):  # grpo: a mean over every row
        t = _trainer(policy, tmp_path / loss_type, mask_truncated_completions=True, loss_type=loss_type)
        batch = _prepared(t, rows, shift=0.0)
        assert batch[LOSS_MASK][2].sum() == 0 and batch["completion_mask"][2].sum() == 4
        assert batch["num_items_in_batch"] == sum(len(r.completion_ids) for r in finished)
        alone = _prepared(t, finished, shift=0.0)
        torch.testing.assert_close(t.grpo.loss(t.learner, batch), share * t.grpo.loss(t.learner, alone))
    assert with_gradient(rows, 0.1, mask_truncated=True) == [0, 1, 3]  # no gradient, even with a KL term
    assert with_gradient(rows, 0.0, skip_zero_advantage=False, mask_truncated=True) == [0, 1, 2, 3]


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_an_update_with_a_masked_truncated_row_is_the_update_without_it(tmp_path, monkeypatch, loss_type):
    """In float64 (``tests/precision.py``): the two batches are padded to other widths."""
    rows = _rows(advantages=(1.0, -0.5, 5.0, -1.0))
    weights = {}
    for name, part in (("all", rows), ("finished", [r for r in rows if r.finished])):
        policy = to_float64(_policy(tmp_path / name), monkeypatch)
        stats = _trainer(policy, tmp_path / name, loss_type=loss_type, mask_truncated_completions=True).update(
            part, random.Random(0))
        weights[name] = {k: v.clone() for k, v in policy.model.state_dict().items()}
        assert stats["masked_truncated_fraction"] == (1 / 4 if name == "all" else 0.0)
    for key, value in weights["all"].items():
        torch.testing.assert_close(weights["finished"][key], value, atol=after_adam(1e-2, 1, TERMS), rtol=0, msg=key)


def test_the_off_policy_mask_drops_negative_advantage_rows_far_from_the_sampler(policy, tmp_path):
    """Row 3 (A < 0) was sampled 9 nats a token above the learner: dropped, as if its advantage were 0; row 0
    (A > 0) as far off is kept; rows without the sampler's log-probs are measured against the old policy's."""
    rows = _rows(finished=(True,) * 4)
    for i in (0, 3):
        rows[i].sampling_logprobs = [0.0] * len(rows[i].completion_ids)
    t = _trainer(policy, tmp_path, off_policy_mask_threshold=0.3)
    batch = _prepared(t, rows, shift=0.0)
    sampled = batch["sampling_per_token_logps"]
    assert torch.equal(sampled[1], batch["old_per_token_logps"][1]) and (sampled[3] == 0).all()
    plain = _trainer(policy, tmp_path / "plain")
    zeroed = _rows(advantages=(1.0, -0.5, 0.8, 0.0), finished=(True,) * 4)
    torch.testing.assert_close(t.grpo.loss(t.learner, batch),
                               plain.grpo.loss(plain.learner, _prepared(plain, zeroed, shift=0.0)))
    stats = t.update(rows, random.Random(0))
    assert stats["off_policy_masked_fraction"] == pytest.approx(len(rows[3].completion_ids) / 14)


def test_the_entropy_bonus_subtracts_the_mean_token_entropy(policy, tmp_path):
    t = _trainer(policy, tmp_path, entropy_coef=0.1)
    plain = _trainer(policy, tmp_path / "plain")
    batch = _prepared(t, _rows(finished=(True,) * 4))
    with torch.no_grad():
        entropy = t.grpo.logps(t.learner, batch, entropy=True)[1]
    mean = (entropy * batch["completion_mask"]).sum() / batch["completion_mask"].sum()
    torch.testing.assert_close(t.grpo.loss(t.learner, batch), plain.grpo.loss(plain.learner, batch) - 0.1 * mean)


def test_the_top_entropy_quantile_trains_only_the_high_entropy_tokens(policy, tmp_path):
    """ρ = 0.3: the loss is the loss with a zero advantage on every token below the 0.7 quantile of entropy."""
    t = _trainer(policy, tmp_path, top_entropy_quantile=0.3)
    plain = _trainer(policy, tmp_path / "plain")
    rows = _rows(finished=(True,) * 4)
    batch = _prepared(t, rows)
    with torch.no_grad():
        entropy = t.grpo.logps(t.learner, batch, entropy=True)[1]
    mask = batch["completion_mask"].bool()
    high = (entropy >= torch.quantile(entropy[mask], 0.7)) & mask
    assert 0 < high.sum() < mask.sum()
    token_credit = dict(batch, advantages=batch["advantages"][:, None] * high)
    torch.testing.assert_close(t.grpo.loss(t.learner, batch), plain.grpo.loss(plain.learner, token_credit))


SKIPPED = {  # the knobs, and the metric that shows them acting in these steps
    "gspo": ({"importance_sampling_level": "sequence", "epsilon": 0.02}, "clip_ratio/region_mean"),
    "two_sided_clip": ({"delta": 1.25, "epsilon": 0.1}, "clip_ratio/delta_mean"),
    "truncated": ({"mask_truncated_completions": True, "loss_type": "bnpo"}, "masked_truncated_fraction"),
    "off_policy": ({"off_policy_mask_threshold": 0.01}, "off_policy_masked_fraction"),
    "entropy": ({"entropy_coef": 0.05, "top_entropy_quantile": 0.5}, "entropy_coef"),
}


@pytest.mark.parametrize("knobs,acting", SKIPPED.values(), ids=SKIPPED)
def test_skipping_rows_without_gradient_gives_the_same_update(tmp_path, monkeypatch, knobs, acting):
    """As ``test_policy_trainer``'s test for the loss types (float64, the same bounds), a third of the rows
    truncated: rows without a gradient (a zero advantage, a masked truncated completion) are skipped, or every
    row runs where the loss reads the whole batch (an entropy bonus, the top-entropy quantile)."""
    results, initial = {}, None
    for skip in (False, True):
        policy = to_float64(_policy(tmp_path / str(skip)), monkeypatch)
        initial = {k: v.clone() for k, v in policy.model.state_dict().items()}
        t = _trainer(policy, tmp_path / str(skip), mini_batch_size=3, learning_rate=5e-3, skip_zero_advantage=skip,
                     **knobs)
        stats = []
        for step in range(3):
            rows = _mixed_rows(step)
            for i, row in enumerate(rows):
                row.finished = i % 3 != 1
            stats.append(t.update(rows, random.Random(step)))
        results[skip] = ({k: v.clone() for k, v in policy.model.state_dict().items()}, stats)
    (full, full_stats), (skipped, skip_stats) = results[False], results[True]
    for key, value in full.items():
        torch.testing.assert_close(skipped[key], value, atol=after_adam(5e-3, 3, TERMS), rtol=0, msg=key)
    whole = reads_whole_batch(OmegaConf.structured(TrainerConfig(**knobs)))
    assert all((s["trained_row_fraction"] == 1.0) == whole for s in skip_stats)
    assert any(not torch.equal(initial[key], value) for key, value in full.items())
    assert any(s[acting] > 0 for s in full_stats) and any(s[acting] > 0 for s in skip_stats)


def test_the_adaptive_entropy_state_is_saved_and_restored(tmp_path):
    knobs = {"use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_coef_delta": 0.02, "entropy_target": 10.0}
    t = _trainer(_policy(tmp_path / "a"), tmp_path / "a", **knobs)
    for step in range(2):
        t.update(_rows(), random.Random(step))
    state = t.state_dict()
    assert state["loss"]["entropy_coef"] == pytest.approx(0.05) and state["loss"]["last_world_entropy"] < 10.0
    fresh = _trainer(_policy(tmp_path / "b"), tmp_path / "b", **knobs)
    fresh.load_state_dict(state)
    assert fresh.grpo.loss_state() == state["loss"]
    older = {k: v for k, v in state.items() if k != "loss"}  # a checkpoint from before the loss had a state
    other = _trainer(_policy(tmp_path / "c"), tmp_path / "c", **knobs)
    other.load_state_dict(older)
    assert other.grpo.loss_state() == {"entropy_coef": 0.01, "last_world_entropy": math.inf}
    assert _trainer(_policy(tmp_path / "d"), tmp_path / "d").state_dict()["loss"] == {}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo"])
def test_a_rank_padded_with_copies_has_the_gradient_of_its_own_rows_under_a_kl_penalty(tmp_path, monkeypatch,
                                                                                        loss_type):
    """A rank with fewer rows than the others runs copies of its first row with advantage 0; with β > 0 their KL terms
    would add gradient, so they leave the loss mask: loss × weight is that of the rank's own rows alone. In float64
    (``tests/precision.py``): the two batches have other sizes, so their sums run in other orders."""
    from marl_cli.core.world import World
    from marl_cli.training.learner.policy_trainer import loss_weight, select_rows

    trainer = _trainer(to_float64(_policy(tmp_path), monkeypatch), tmp_path, beta=0.1, loss_type=loss_type)
    rows = _rows(finished=(True,) * 4)
    whole = _prepared(trainer, rows)
    whole["ref_per_token_logps"] = whole["old_per_token_logps"] - 0.3 * whole["completion_mask"]
    gradients = []
    for index, copies in (([0, 1], 0), ([0, 1, 0, 0], 2)):
        batch = select_rows(whole, index, copies)
        weight = loss_weight(loss_type, [rows[i] for i in index], rows, World(), copies=copies)
        trainer.learner.zero_grad()
        (trainer.grpo.loss(trainer.learner, batch) * weight).backward()
        gradients.append([p.grad.clone() for p in trainer.params if p.grad is not None])
    for alone, padded in zip(*gradients, strict=True):
        assert_rounding_close(padded, alone, TERMS)
