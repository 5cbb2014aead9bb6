"""DESIGN §6: the trained row is what was sampled, old log-probs are the sampler's, bf16 moves, options work."""

import functools
import math
import random

import pytest
import torch
from omegaconf import OmegaConf

from marl_cli.config.schema import ModelConfig, TrainerConfig
from marl_cli.core.samples import Sample
from marl_cli.policies.regime import build_policies
from marl_cli.rollout.generation import HFGenerator, Sampling, encode_prompts
from marl_cli.training.learner.policy_trainer import PolicyTrainer, collate
from tests.policies.test_tiny import SMALL
from tests.precision import after_adam, assert_rounding_close, eps, rounding, to_float64

TERMS = 20_000
"""An upper bound on the terms a gradient entry here accumulates (12 rows × ≤ 60 positions × widths ≤ 64)."""
SAMPLER_GAP = 4 * eps(torch.float32) * (10 + math.log(128))
"""The sampler's log-probs against a float64 learner's: the sampler rounds its logits (within ±10 for the
tiny model at init) to float32 and takes a float32 log-softmax (≤ eps·(|z| + log V) each), and the row holds
them in float32 (eps·|log p|): 7e-6; a token scored at the wrong position or temperature is off by > 0.1."""
KL_OF_ROUNDING = 1e-8
"""KL between two float32 scorings of the same weights: per token ≈ d²/2 for a log-prob difference d, and d is
at most float32's rounding of the logits' ~200-term accumulations (200 · eps · |z| ≈ 1.2e-4 for |z| ≤ 5):
7e-9; one optimiser step at these learning rates gives a KL > 1e-4."""
PROMPTS = [f"Go from S to G on grid {i}.\nS . #\n. . G\nAnswer after ####." for i in range(6)]


def _policy(tmp_path, dtype="float32", master_weights=False):
    cfg = OmegaConf.structured(ModelConfig(tiny=SMALL, dtype=dtype))
    return build_policies({"agent": "shared"}, cfg, 0, tmp_path, torch.device("cpu"),
                          master_weights=master_weights)["shared"]


def _trainer(policy, tmp_path, **kw):
    cfg = OmegaConf.structured(TrainerConfig(**{"learning_rate": 1e-2, "steps": 10, **kw}))
    return PolicyTrainer(policy, cfg, temperature=0.7, max_completion_length=16, output_dir=tmp_path / "trl", seed=0)


def _sampled_rows(policy, n_per_prompt=2, max_new_tokens=16, seed=0, prompts=PROMPTS):
    torch.manual_seed(seed)
    gens = HFGenerator().generate(policy, [p for p in prompts for _ in range(n_per_prompt)],
                                  Sampling(0.7, max_new_tokens=max_new_tokens))
    rng = random.Random(seed)
    return [Sample(task=i // n_per_prompt, branch=i % n_per_prompt, turn=0, role="agent", policy=policy.name,
                   prompt_ids=g.prompt_ids, completion_ids=g.completion_ids, reward=0.0,
                   advantage=rng.choice([-1.0, 1.0]), sampling_logprobs=g.logprobs, finished=g.finished)
            for i, g in enumerate(gens)]


def test_old_logprobs_of_every_mini_batch_are_the_samplers(tmp_path, monkeypatch):
    policy = to_float64(_policy(tmp_path), monkeypatch)  # the learner in float64; the sampler's last step is float32
    rows = _sampled_rows(policy)
    trainer = _trainer(policy, tmp_path, mini_batch_size=4, learning_rate=5e-2)  # 12 rows: 3 mini-batches
    seen = []
    compute_loss = trainer.grpo.trl.compute_loss

    def spy(model, batch):
        given = batch.get("old_per_token_logps")
        loss = compute_loss(model, batch)  # without old log-probs TRL takes its own forward's, detached
        seen.append({"old_per_token_logps": trainer.grpo.last_logps if given is None else given.clone(),
                     "given": given is not None, **{k: batch[k].clone() for k in ("sampling_logps", "sampling_mask")}})
        return loss

    trainer.grpo.trl.compute_loss = spy
    stats = trainer.update(rows, random.Random(0))
    assert [batch["given"] for batch in seen] == [False, True, True]  # the first step scores its own old log-probs
    for batch in seen:
        mask = batch["sampling_mask"].bool()
        assert mask.sum() > 0
        assert (batch["old_per_token_logps"][mask] - batch["sampling_logps"][mask]).abs().max() < SAMPLER_GAP
    assert stats["logprob_gap/max"] < SAMPLER_GAP
    # later mini-batches see a policy that has moved: the ratio departs from 1 and the clip acts
    assert stats["kl_old"] > 0
    assert stats["clip_ratio/region_mean"] > 0
    assert stats["mini_batches"] == 3


@pytest.mark.parametrize("mini_batch_size", [64, 4])
def test_the_first_step_scoring_its_own_old_logprobs_is_the_update_with_them_scored_ahead(tmp_path, monkeypatch,
                                                                                          mini_batch_size):
    """In float64, one mini-batch or three, a third of the rows without gradient (scored ahead either way): the
    weights and the sampling policy's statistics are those of scoring every row before the first optimiser step."""
    weights, stats = {}, {}
    for ahead in (False, True):
        policy = to_float64(_policy(tmp_path / str(ahead)), monkeypatch)
        rows = _sampled_rows(policy)
        for row in rows[::3]:
            row.advantage = 0.0
        trainer = _trainer(policy, tmp_path / str(ahead), mini_batch_size=mini_batch_size, learning_rate=5e-2)
        if ahead:
            monkeypatch.setattr(trainer, "_self_scoring", lambda mb: None)
        stats[ahead] = trainer.update(rows, random.Random(0))
        weights[ahead] = {k: v.detach().clone() for k, v in policy.model.named_parameters()}
    for key, value in weights[True].items():
        torch.testing.assert_close(weights[False][key], value, atol=after_adam(5e-2, 3, TERMS), rtol=0, msg=key)
    for key in ("entropy", "logprob_gap/mean", "logprob_gap/max"):
        assert stats[False][key] == pytest.approx(stats[True][key], rel=rounding(TERMS)), key
    assert stats[False]["kl_old"] <= stats[True]["kl_old"] + rounding(TERMS)


def test_a_groups_prompt_is_prefilled_once_and_samples_as_without_sharing(tmp_path, monkeypatch):
    policy = to_float64(_policy(tmp_path), monkeypatch)
    prefills = []
    original = policy.model.forward

    @functools.wraps(original)  # generate reads the forward's signature (position ids)
    def counting(*args, **kwargs):
        if kwargs.get("logits_to_keep") == 1 and kwargs.get("use_cache") and "cache" not in kwargs \
                and "past_key_values" not in kwargs:  # a prefill, not one of generate's decoding steps
            prefills.append(len(kwargs["input_ids"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(policy.model, "forward", counting)
    prompts = [p.replace("grid", "grid " + "x" * 3 * i) for i, p in enumerate(PROMPTS)]  # left-padded unequally
    shared = _sampled_rows(policy, n_per_prompt=4, prompts=prompts)
    assert prefills == [len(prompts)]  # 24 rows, each distinct prompt prefilled once
    stats = _trainer(policy, tmp_path, learning_rate=0.0).update(shared, random.Random(0))
    assert stats["logprob_gap/max"] < SAMPLER_GAP  # the sampler's log-probs are the learner's
    monkeypatch.setattr("marl_cli.rollout.generation.shared_prompt_cache", lambda *a, **k: None)
    plain = _sampled_rows(policy, n_per_prompt=4, prompts=prompts)
    assert [r.completion_ids for r in shared] == [r.completion_ids for r in plain]
    for one, other in zip(shared, plain, strict=True):
        assert one.sampling_logprobs == pytest.approx(other.sampling_logprobs, abs=SAMPLER_GAP)


def test_long_prompt_keeps_its_end(tmp_path):
    policy = _policy(tmp_path)
    tail = "Answer after ####."
    prompt = "x" * 300 + tail
    ids, truncated = encode_prompts(policy, [prompt, tail], Sampling(1.0, max_prompt_length=64,
                                                                     use_chat_template=False))
    assert truncated == [True, False]
    assert len(ids[0]) == 64
    assert policy.tokenizer.decode(ids[0]).endswith(tail)
    gen = HFGenerator().generate(policy, [prompt], Sampling(0.0, max_new_tokens=4, max_prompt_length=64,
                                                            use_chat_template=False))[0]
    assert gen.prompt_ids == ids[0] and gen.prompt_truncated


def test_completion_is_kept_token_for_token(tmp_path):
    policy = _policy(tmp_path)
    pad = policy.tokenizer.pad_token_id
    torch.manual_seed(0)
    gens = HFGenerator().generate(policy, PROMPTS * 8, Sampling(1.5, max_new_tokens=24, use_chat_template=False))
    unfinished = [g for g in gens if not g.finished]
    assert all(len(g.completion_ids) == 24 for g in unfinished)
    with_pad = [g for g in unfinished if pad in g.completion_ids]
    assert with_pad, "the untrained tiny model samples its pad id now and then at T=1.5"
    g = with_pad[0]
    row = Sample(task=0, branch=0, turn=0, role="agent", policy="shared", prompt_ids=g.prompt_ids,
                 completion_ids=g.completion_ids, reward=0.0, sampling_logprobs=g.logprobs)
    batch = collate([row], pad, torch.device("cpu"))
    assert batch["completion_ids"][0].tolist() == g.completion_ids
    assert batch["completion_mask"].sum() == 24
    finished = [g for g in gens if g.finished]
    assert finished and all(g.completion_ids[-1] == policy.tokenizer.eos_token_id for g in finished)
    assert all(len(g.logprobs) == len(g.completion_ids) for g in gens)


def test_every_end_token_of_the_generation_config_stops(tmp_path):
    policy = _policy(tmp_path)
    tok = policy.tokenizer
    extra = tok.convert_tokens_to_ids(".")
    policy.model.generation_config.eos_token_id = [tok.eos_token_id, extra]
    torch.manual_seed(0)
    gens = HFGenerator().generate(policy, PROMPTS * 4, Sampling(1.5, max_new_tokens=24, use_chat_template=False))
    ends = {tok.eos_token_id, extra}
    stopped = [g for g in gens if g.finished]
    assert any(g.completion_ids[-1] == extra for g in stopped)
    for g in gens:
        assert not ends & set(g.completion_ids[:-1])
        assert g.finished == (g.completion_ids[-1] in ends)


def test_bf16_policy_moves_at_lr_1e_6(tmp_path):
    policy = _policy(tmp_path, dtype="bfloat16", master_weights=True)
    assert next(policy.model.parameters()).dtype == torch.float32 and policy.compute_dtype == torch.bfloat16
    rows = _sampled_rows(policy)
    trainer = _trainer(policy, tmp_path, learning_rate=1e-6, mini_batch_size=64)
    assert trainer.grpo.trl.accelerator.mixed_precision == "bf16"
    before = {k: v.clone() for k, v in policy.model.named_parameters()}
    for _ in range(2):
        trainer.update(rows, random.Random(0))
    changed = sum(int((before[k] != v).sum()) for k, v in policy.model.named_parameters())
    total = sum(v.numel() for v in before.values())
    assert changed / total > 0.9
    state = trainer.optimizer.state_dict()["state"]
    assert all(s["exp_avg"].dtype == torch.float32 for s in state.values())


def test_bf16_without_master_weights_is_what_eval_loads(tmp_path):
    policy = _policy(tmp_path, dtype="bfloat16")
    assert next(policy.model.parameters()).dtype == torch.bfloat16


def _saved_bytes_and_grads(policy, trainer, batch):
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    policy.model.zero_grad(set_to_none=True)
    batch = dict(batch, old_per_token_logps=trainer._logps(policy.model, batch))
    policy.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = trainer.grpo.loss(policy.model, batch)
    loss.backward()
    return sum(saved), {k: p.grad.clone() for k, p in policy.model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_is_really_on(tmp_path, monkeypatch):
    policy = to_float64(_policy(tmp_path), monkeypatch)  # the gradients compared in float64
    rows = _sampled_rows(policy)
    batch = collate(rows, policy.tokenizer.pad_token_id, torch.device("cpu"))
    plain = _trainer(policy, tmp_path / "a")
    bytes_plain, grads_plain = _saved_bytes_and_grads(policy, plain, batch)
    assert not policy.model.is_gradient_checkpointing
    ckpt = _trainer(policy, tmp_path / "b", gradient_checkpointing=True)
    assert policy.model.is_gradient_checkpointing
    bytes_ckpt, grads_ckpt = _saved_bytes_and_grads(policy, ckpt, batch)
    assert bytes_ckpt < 0.8 * bytes_plain
    assert grads_plain.keys() == grads_ckpt.keys()
    for k in grads_plain:
        assert_rounding_close(grads_ckpt[k], grads_plain[k], TERMS, k)


def test_reference_kl_is_logged_with_beta_zero(tmp_path):
    policy = _policy(tmp_path)
    rows = _sampled_rows(policy)
    trainer = _trainer(policy, tmp_path, log_ref_kl=True, mini_batch_size=4, learning_rate=5e-2)
    first = trainer.update(rows, random.Random(0))
    assert first["kl_ref"] == pytest.approx(0.0, abs=KL_OF_ROUNDING)  # the reference is the policy RL started from
    second = trainer.update(rows, random.Random(0))
    assert second["kl_ref"] > 1e-4
    assert "kl_ref" not in _trainer(policy, tmp_path / "c").update(rows, random.Random(0))


def test_beta_uses_the_policy_rl_started_from_as_reference(tmp_path):
    policy = _policy(tmp_path)
    with torch.no_grad():  # as a warm start would: the in-memory weights differ from the saved source
        for p in policy.model.parameters():
            p.add_(0.01)
    trainer = _trainer(policy, tmp_path, beta=0.1)
    for (name, p), r in zip(policy.model.named_parameters(), trainer.reference.parameters(), strict=True):
        assert torch.equal(p, r), name
    stats = trainer.update(_sampled_rows(policy), random.Random(0))
    assert stats["kl"] == pytest.approx(0.0, abs=KL_OF_ROUNDING)
    assert stats["kl_ref"] == pytest.approx(0.0, abs=KL_OF_ROUNDING)
