"""The backend contract on its own: every registered backend's generator is a ``Generator``, and naming or
building the rollout machinery never imports vLLM."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import marl_cli
from marl_cli.config.errors import ConfigError
from marl_cli.rollout.backends import vllm as vllm_backend
from marl_cli.rollout.backends.base import BACKENDS, Generator
from marl_cli.rollout.generation import HFGenerator
from tests.helpers import FAST, ScriptedGenerator, train_config

TEAM = [*FAST, "rollout=vllm", "workflow=tool_plan", "algorithm=at_grpo"]


def test_the_hf_generator_and_a_test_double_satisfy_the_protocol():
    assert isinstance(HFGenerator(), Generator)
    assert isinstance(ScriptedGenerator(lambda *a: ""), Generator)
    assert not isinstance(object(), Generator)


def test_the_vllm_generator_has_the_protocols_methods_with_its_signatures():
    from marl_cli.rollout.vllm_generator import VLLMGenerator

    for name in ("generate", "start", "release"):
        theirs = inspect.signature(getattr(VLLMGenerator, name))
        ours = inspect.signature(getattr(Generator, name))
        assert list(theirs.parameters) == list(ours.parameters), name
    assert "self.calls = 0" in inspect.getsource(VLLMGenerator.__init__)


def test_no_module_imports_vllm_at_module_level():
    """vLLM is an optional extra: only the functions that build or drive an engine import it (read from the source,
    so the check holds whether or not vllm is installed)."""
    package = Path(marl_cli.__file__).parent
    for path in package.rglob("*.py"):
        body = ast.parse(path.read_text()).body
        top = [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
        top += [n for t in body if isinstance(t, ast.If | ast.Try) for n in ast.walk(t)
                if isinstance(n, ast.Import | ast.ImportFrom)]
        names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n == "vllm" or n.startswith("vllm.")], path


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_on_cpu", lambda: False)


@pytest.mark.usefixtures("on_gpu")
def test_engines_whose_gpu_shares_add_up_past_one_card_are_refused_before_any_model_is_built():
    assert BACKENDS.checks["vllm"] is vllm_backend.check_engines  # run by config.validate with the backend's own
    cfg = train_config(*TEAM, "policy=per_role", "rollout.vllm.gpu_memory_utilization=0.6")
    with pytest.raises(ConfigError, match=r"^rollout=vllm runs 2 engines \(one per policy: tool, plan\) at "
                       r"rollout.vllm.gpu_memory_utilization=0.6 each: 1.2 of one GPU's memory; lower it to at most "
                       r"0.5 .*policy.devices=\[cuda:0,cuda:1\]\)$"):
        vllm_backend.check_engines(cfg)
    vllm_backend.check_engines(train_config(*TEAM, "policy=per_role", "rollout.vllm.gpu_memory_utilization=0.5"))
    for one_engine in ("policy=shared", "policy=lora_per_role"):  # one model, or one base serving the adapters
        vllm_backend.check_engines(train_config(*TEAM, one_engine, "rollout.vllm.gpu_memory_utilization=0.9"))
    # a custom map: one policy for both roles is one engine
    vllm_backend.check_engines(train_config(*TEAM, "policy=per_role", "+policy.assignment.plan=tool",
                                            "rollout.vllm.gpu_memory_utilization=0.9"))
    two_bases = train_config(*TEAM, "policy=lora_per_role", "+policy.models.tool.tiny.num_hidden_layers=2",
                             "rollout.vllm.gpu_memory_utilization=0.6")  # a base model of its own: two engines
    with pytest.raises(ConfigError, match=r"^rollout=vllm runs 2 engines \(one per base model: lora_base_tool, "
                       r"lora_base\) at rollout.vllm.gpu_memory_utilization=0.6 each"):
        vllm_backend.check_engines(two_bases)


def test_kv_caches_larger_than_the_machines_memory_are_refused_on_vllms_cpu_build(monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_on_cpu", lambda: True)
    monkeypatch.setattr(vllm_backend, "memory_gib", lambda: 15.6)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cfg = train_config(*TEAM, "policy=per_role", "rollout.vllm.cpu_kv_cache_gib=8",
                       "rollout.vllm.gpu_memory_utilization=0.9")  # no GPU share counts on a CPU
    with pytest.raises(ConfigError, match=r"^rollout=vllm runs 2 engines \(one per policy: tool, plan\) with a 8 GiB "
                       r"KV cache each \(rollout.vllm.cpu_kv_cache_gib=8\): 16 GiB, more than this machine's 15.6 "
                       r"GiB of memory; lower it to at most 7$"):
        vllm_backend.check_engines(cfg)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")  # the engines take the environment's size when it is set
    vllm_backend.check_engines(cfg)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "9")
    with pytest.raises(ConfigError, match=r"with a 9 GiB KV cache each \(VLLM_CPU_KVCACHE_SPACE=9\)"):
        vllm_backend.check_engines(train_config(*TEAM, "policy=per_role"))


def test_each_engine_holds_the_prompt_limit_and_the_longest_completion_any_role_samples():
    cfg = train_config(*TEAM, "policy=per_role", "rollout.max_prompt_length=100",
                       "+rollout.roles.plan.max_new_tokens=40", "+eval.roles.tool.max_new_tokens=30")
    assert BACKENDS.get("vllm")(cfg).max_model_len == 100 + 40
    assert BACKENDS.get("vllm")(train_config(*TEAM, "rollout.max_prompt_length=100")).max_model_len == 100 + 12
