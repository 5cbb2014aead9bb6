"""``policy=lora_per_role`` with a model per group of roles: the policies of one model config share a frozen base, a
policy given its own model (``policy.models``) gets its own (``lora_base_<policy>``); each base warm-starts on its
roles' demonstrations and carries its policies' adapters through training, an exact resume and ``marl eval load=``.
The one-base layout (``lora_base/``, adapters only in checkpoints) is as it was."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from marl_cli.policies.roles import LORA_BASE
from marl_cli.rollout.backends.vllm import engine_policies
from marl_cli.training.build import build_run
from marl_cli.training.loop import train
from tests.helpers import FAST, cli, metric_records, step_records, train_config

# Plan-Path's tool agent on a 2-layer model 48 wide, its plan agent on FAST's 1-layer model 32 wide
GROUPS = [*FAST, "workflow=tool_plan", "algorithm=at_grpo", "policy=lora_per_role", "policy.lora_r=4",
          "+policy.models.tool.tiny.num_hidden_layers=2", "+policy.models.tool.tiny.hidden_size=48",
          "+policy.models.tool.tiny.head_dim=8"]
# warm-started enough to answer in the format now and then, so rewards differ within groups and adapters train
WARM = ["trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=48", "trainer.warmstart.epochs=4",
        "trainer.warmstart.learning_rate=3e-2", "trainer.warmstart.batch_size=8"]
ROLES = ("tool", "plan")
TOOL_BASE = f"{LORA_BASE}_tool"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """One warm-start cache for the module: the runs of a test start from the same warm-started bases."""
    return f"trainer.warmstart.cache={tmp_path_factory.mktemp('warmstart')}"


def _warm_start(run: Path) -> dict:
    return next(r for r in metric_records(run) if any(k.startswith("warmstart/") for k in r))


def _adapter(checkpoint: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "policies" / name / "adapter_model.safetensors")


def _shape(model_dir: Path) -> tuple[int, int]:
    config = json.loads((model_dir / "config.json").read_text())
    return config["num_hidden_layers"], config["hidden_size"]


def test_each_model_config_gets_a_base_and_each_adapter_sits_on_its_own(tmp_path):
    cfg = train_config(*GROUPS)
    assert engine_policies(cfg) == [TOOL_BASE, LORA_BASE]  # rollout=vllm: one engine per base
    run = build_run(cfg, tmp_path / "run")
    assert {n: (p.roles, p.model.config.num_hidden_layers, p.model.config.hidden_size)
            for n, p in run.policies.items()} == {TOOL_BASE: (["tool"], 2, 48), LORA_BASE: (["plan"], 1, 32)}
    assert run.adapters_pending and run.routing == {"tool": TOOL_BASE, "plan": LORA_BASE}
    bases = dict(run.policies)
    run.attach_adapters()
    assert not run.adapters_pending and run.routing == {"tool": "tool", "plan": "plan"}
    for name, base in (("tool", TOOL_BASE), ("plan", LORA_BASE)):
        policy = run.policies[name]
        assert policy.base == base and policy.model.get_base_model() is bases[base].model
    assert _shape(tmp_path / "run" / TOOL_BASE) == (2, 48) and _shape(tmp_path / "run" / LORA_BASE) == (1, 32)


def test_a_lora_team_of_two_models_trains_resumes_exactly_and_evaluates_from_its_checkpoint(tmp_path, cache):
    run = tmp_path / "whole"
    summary = train(train_config(*GROUPS, *WARM, cache, "trainer.steps=2"), run)
    assert summary["status"] == "completed" and summary["policies"] == {"tool": ["tool"], "plan": ["plan"]}
    warm = _warm_start(run)
    assert warm[f"warmstart/{TOOL_BASE}/examples"] == warm[f"warmstart/{LORA_BASE}/examples"] == 48  # its roles' own
    assert (_shape(run / TOOL_BASE), _shape(run / LORA_BASE)) == ((2, 48), (1, 32))
    last = run / "checkpoints" / "step_000002"
    widths = {n: _adapter(last, n)["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape[1]
              for n in ROLES}
    assert widths == {"tool": 48, "plan": 32}  # each adapter on its own base
    assert not (last / "policies" / "tool" / "config.json").exists()  # adapters only: the bases stay in the run dir
    steps = step_records(run)
    assert [r["step"] for r in steps] == [1, 2] and any(r["train/plan/grad_norm"] > 0 for r in steps)
    part = tmp_path / "part"
    train(train_config(*GROUPS, *WARM, cache, "trainer.steps=1", "trainer.save_every=1"), part)
    train(train_config(*GROUPS, *WARM, cache, "trainer.steps=2", f"trainer.resume={part}"), tmp_path / "unused")
    moved = False
    for name in ROLES:
        final, again = _adapter(last, name), _adapter(part / "checkpoints" / "step_000002", name)
        first = _adapter(part / "checkpoints" / "step_000001", name)
        assert final.keys() == again.keys() and all(torch.equal(final[k], again[k]) for k in final)
        moved |= any(not torch.equal(final[k], first[k]) for k in final)
    assert moved  # the step after the resume trained
    assert [r["train/reward"] for r in step_records(part)] == [r["train/reward"] for r in steps]

    out = cli("eval", *GROUPS, f"load={run}", f"hydra.run.dir={tmp_path / 'eval'}")
    assert out.returncode == 0, out.stderr[-3000:]
    evaluated = json.loads((tmp_path / "eval" / "summary.json").read_text())
    for key in ("eval/success", "eval/tool/reward", "eval/plan/reward", "eval/plan/completion_tokens"):
        assert evaluated[key] == summary[key], key  # greedy on the same held-out tasks with the same weights
    out = cli("eval", *GROUPS[:-3], f"load={run}", f"hydra.run.dir={tmp_path / 'forgot'}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"marl eval: error: load={last}: the run saved the bases ['{LORA_BASE}', '{TOOL_BASE}'], this config's "
        f"policies sit on ['{LORA_BASE}']; evaluate with the run's policy.models"]


def test_one_model_for_every_policy_keeps_the_one_base_layout(tmp_path):
    run = tmp_path / "run"
    train(train_config(*GROUPS[:-3], "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=8",
                       "trainer.warmstart.batch_size=8", "trainer.steps=1"), run)
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoints", LORA_BASE, "metrics.jsonl", "samples.jsonl", "summary.json", "tiny_init", "train.log", "trl",
        "warmstart"]
    assert [p.name for p in (run / "warmstart").iterdir()] == [LORA_BASE]
    assert sorted(_warm_start(run)) == ["step", *(f"warmstart/{LORA_BASE}/{k}" for k in ("examples", "loss", "steps"))]
    checkpoint = run / "checkpoints" / "step_000001"
    assert sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file()) == [
        "manifest.json", *(f"policies/{n}/{f}" for n in ("plan", "tool") for f in (
            "adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json")),
        "state.pt"]
