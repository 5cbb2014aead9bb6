"""Policy regimes: updates reach only the policy a row is routed to; LoRA never touches the base, and the policies
of one model config share a base (one base per model config)."""

import random
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ModelConfig, PolicyConfig, TrainerConfig
from marl_cli.core.samples import Sample
from marl_cli.policies.loading import load_model
from marl_cli.policies.regime import attach_adapters, attach_all_adapters, build_policies, routing
from marl_cli.policies.roles import LORA_BASE, assign_roles, lora_bases
from marl_cli.training.build import resolve_device
from marl_cli.training.learner.policy_trainer import PolicyTrainer
from tests.policies.test_tiny import SMALL

ROLES = ["tool", "plan"]


def _rows(policy: str, role: str) -> list[Sample]:
    return [Sample(task=0, branch=i, turn=0, role=role, policy=policy, prompt_ids=[10, 11, 12],
                   completion_ids=[20 + i, 21, 1], reward=0.0, advantage=a) for i, a in enumerate([1.0, -1.0])]


def _trainers(policies, tmp_path):
    cfg = OmegaConf.structured(TrainerConfig(learning_rate=1e-2, steps=5, mini_batch_size=2))
    return {n: PolicyTrainer(p, cfg, 1.0, 8, tmp_path / "trl" / n, 0) for n, p in policies.items()}


def _snapshot(module: torch.nn.Module, include=lambda name: True) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters() if include(k)}


def _changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> set[str]:
    now = dict(module.named_parameters())
    return {k for k, v in before.items() if not torch.equal(v, now[k])}


def _policy_cfg(name: str):
    return OmegaConf.structured(PolicyConfig(name=name, lora_r=4, lora_alpha=8))


def test_per_role_update_leaves_the_other_role_unchanged(tmp_path):
    role_map = assign_roles(_policy_cfg("per_role"), ROLES)
    policies = build_policies(role_map, OmegaConf.structured(ModelConfig(tiny=SMALL)), 0, tmp_path,
                              torch.device("cpu"), regime="per_role")
    assert set(policies) == {"tool", "plan"} and policies["tool"].model is not policies["plan"].model
    trainers = _trainers(policies, tmp_path)
    tool_before, plan_before = _snapshot(policies["tool"].model), _snapshot(policies["plan"].model)
    trainers["tool"].update(_rows("tool", "tool"), random.Random(0))
    assert _changed(tool_before, policies["tool"].model)
    assert not _changed(plan_before, policies["plan"].model)


def test_lora_per_role_trains_only_the_routed_adapter_and_never_the_base(tmp_path):
    cfg = _policy_cfg("lora_per_role")
    role_map = assign_roles(cfg, ROLES)
    base = build_policies(role_map, OmegaConf.structured(ModelConfig(tiny=SMALL)), 0, tmp_path,
                          torch.device("cpu"), regime="lora_per_role")
    assert list(base) == [LORA_BASE] and base[LORA_BASE].roles == ROLES
    policies = attach_adapters(base[LORA_BASE], role_map, cfg, tmp_path)
    assert policies["tool"].model is policies["plan"].model  # one base in memory
    model = policies["tool"].model
    trainers = _trainers(policies, tmp_path)
    base_before = _snapshot(model, lambda k: "lora_" not in k)
    tool_before = _snapshot(model, lambda k: ".tool." in k)
    plan_before = _snapshot(model, lambda k: ".plan." in k)
    assert tool_before and plan_before
    for _ in range(2):
        trainers["tool"].update(_rows("tool", "tool"), random.Random(0))
    assert not _changed(base_before, model)
    assert not _changed(plan_before, model)
    assert _changed(tool_before, model)
    trainers["plan"].update(_rows("plan", "plan"), random.Random(0))
    assert _changed(plan_before, model) and not _changed(base_before, model)


def test_lora_adapters_round_trip_through_a_checkpoint(tmp_path):
    cfg = _policy_cfg("lora_per_role")
    role_map = assign_roles(cfg, ROLES)
    model_cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    base = build_policies(role_map, model_cfg, 0, tmp_path, torch.device("cpu"), regime="lora_per_role")
    policies = attach_adapters(base[LORA_BASE], role_map, cfg, tmp_path)
    _trainers(policies, tmp_path)["tool"].update(_rows("tool", "tool"), random.Random(0))
    for name, policy in policies.items():
        policy.save(tmp_path / "ckpt" / name)
    expected = _snapshot(policies["tool"].model, lambda k: "lora_" in k)
    again = build_policies(role_map, model_cfg, 0, tmp_path / "other", torch.device("cpu"),
                           {LORA_BASE: str(tmp_path / LORA_BASE)}, "lora_per_role")
    restored = attach_adapters(again[LORA_BASE], role_map, cfg, tmp_path,
                               {n: str(tmp_path / "ckpt" / n) for n in policies})
    assert not _changed(expected, restored["tool"].model)


def test_a_model_that_cannot_be_loaded_is_one_line():
    with pytest.raises(ConfigError, match=r"^cannot load a model from nosuchorg/nosuchmodel: ") as err:
        load_model("nosuchorg/nosuchmodel", "float32", torch.device("cpu"))  # tests run with HF_HUB_OFFLINE=1
    assert "\n" not in str(err.value)
    if not torch.backends.mps.is_available():
        with pytest.raises(ConfigError, match="device='mps' but this machine has no MPS"):
            resolve_device("mps")


def _tiny(**change) -> ModelConfig:
    return OmegaConf.structured(ModelConfig(tiny=replace(SMALL, **change)))


def test_the_policies_of_one_model_config_share_a_base():
    role_map, model = {"tool": "tool", "plan": "plan"}, _tiny()
    other, same = _tiny(hidden_size=48, head_dim=8), _tiny()
    assert lora_bases(role_map, model, {}) == {"tool": LORA_BASE, "plan": LORA_BASE}
    assert lora_bases(role_map, model, {"tool": other}) == {"tool": "lora_base_tool", "plan": LORA_BASE}
    assert lora_bases(role_map, model, {"plan": same}) == {"tool": LORA_BASE, "plan": LORA_BASE}  # changes nothing
    both = {"tool": other, "plan": _tiny(hidden_size=48, head_dim=8)}  # one model, not the run's: named by its first
    assert lora_bases(role_map, model, both) == {"tool": "lora_base_tool", "plan": "lora_base_tool"}
    three = {"tool": "tool", "plan": "plan", "check": "check"}
    assert lora_bases(three, model, {"plan": other, "check": other}) == {
        "tool": LORA_BASE, "plan": "lora_base_plan", "check": "lora_base_plan"}


def test_each_adapter_sits_on_the_base_of_its_model_and_round_trips_through_a_checkpoint(tmp_path):
    cfg = _policy_cfg("lora_per_role")
    role_map = assign_roles(cfg, ROLES)
    models = {"tool": _tiny(hidden_size=48, head_dim=8, num_hidden_layers=2)}
    bases = build_policies(role_map, _tiny(), 0, tmp_path, torch.device("cpu"), regime="lora_per_role", models=models)
    assert {n: (b.roles, b.model.config.hidden_size) for n, b in bases.items()} == {
        "lora_base_tool": (["tool"], 48), LORA_BASE: (["plan"], 32)}
    assert routing(role_map, bases) == {"tool": "lora_base_tool", "plan": LORA_BASE}
    policies = attach_all_adapters(bases, role_map, cfg, tmp_path)
    assert routing(role_map, policies) == role_map
    for name, base in (("tool", "lora_base_tool"), ("plan", LORA_BASE)):
        policy = policies[name]
        assert policy.base == base and policy.model.get_base_model() is bases[base].model
        assert list(policy.model.peft_config) == [name]  # no adapter of the other base's policy on it
        assert (tmp_path / base / "config.json").exists()
    _trainers(policies, tmp_path)["tool"].update(_rows("tool", "tool"), random.Random(0))
    for name, policy in policies.items():
        policy.save(tmp_path / "ckpt" / name)
    expected = _snapshot(policies["tool"].model, lambda k: "lora_" in k)
    sources = {b: str(tmp_path / b) for b in bases}
    again = build_policies(role_map, _tiny(), 0, tmp_path / "other", torch.device("cpu"), sources, "lora_per_role",
                           models=models)
    saved = {n: str(tmp_path / "ckpt" / n) for n in ROLES}
    restored = attach_all_adapters(again, role_map, cfg, tmp_path / "other", saved)
    assert not _changed(expected, restored["tool"].model)
    one = build_policies(role_map, _tiny(), 0, tmp_path / "one", torch.device("cpu"), regime="lora_per_role")
    with pytest.raises(ConfigError, match=r"^the adapter in .*/ckpt/tool does not fit the base lora_base "):
        attach_all_adapters(one, role_map, cfg, tmp_path / "one", {"tool": str(tmp_path / "ckpt" / "tool")})
