"""``build_run`` on its own: what it builds for the tiny model and a two-role workflow."""

from __future__ import annotations

from unittest import mock

from marl_cli.policies import roles
from marl_cli.rollout.backends.base import Generator
from marl_cli.rollout.generation import HFGenerator
from marl_cli.training import build
from marl_cli.training.build import PolicySource, build_run
from marl_cli.training.loop import Trainer
from tests.helpers import FAST, TINY, train_config

TEAM = [*FAST, "workflow=tool_plan", "algorithm=at_grpo", "policy=per_role", "rollout.temperature=0.7",
        "rollout.top_k=5", "rollout.max_new_tokens=9", "eval.temperature=0.0"]


def test_a_two_role_run_builds_one_policy_per_role_and_computes_the_role_map_once(tmp_path):
    cfg = train_config(*TEAM)
    with mock.patch.object(build, "run_role_map", wraps=roles.role_map) as assign:
        run = build_run(cfg, tmp_path / "run")
    assert assign.call_count == 1
    assert run.role_map == {"tool": "tool", "plan": "plan"} and run.routing == run.role_map
    assert set(run.policies) == {"tool", "plan"} and run.policies["plan"].roles == ["plan"]
    assert run.policies is run.rollout.policies and run.workflow.roles == ["tool", "plan"]
    assert isinstance(run.generator, HFGenerator) and isinstance(run.generator, Generator)  # the backend protocol
    assert (run.rollout.mode, run.rollout.selection) == ("tree", cfg.algorithm.selection)
    assert run.source == PolicySource() and run.source.resumed is None  # a fresh run from cfg.model
    assert (tmp_path / "run").is_dir()


def test_one_sampling_setting_reaches_the_generator_the_evaluations_and_the_learner(tmp_path):
    cfg = train_config(*TEAM, "trainer.frozen_roles=[tool]")
    run = build_run(cfg, tmp_path / "run")
    sampling = run.sampling
    assert sampling is run.rollout.sampling
    assert (sampling.temperature, sampling.top_k, sampling.max_new_tokens) == (0.7, 5, 9)
    evaluation = run.rollout.evaluation()
    assert evaluation.sampling.temperature == 0.0 and evaluation.mode == "independent"
    assert (evaluation.sampling.top_k, evaluation.sampling.max_new_tokens) == (5, 9)
    assert evaluation.policies is run.policies and run.rollout.mode == "tree"  # the run's rollout is unchanged
    with mock.patch("marl_cli.training.loop.PolicyTrainer") as learner, \
            mock.patch("marl_cli.training.loop.evaluate", return_value={}):
        Trainer(run).prepare()
    (policy, _, temperature, max_new_tokens, *_), _ = learner.call_args  # the plan policy alone trains
    assert learner.call_count == 1 and policy is run.policies["plan"]
    assert (temperature, max_new_tokens) == (sampling.temperature, sampling.max_new_tokens)


def test_attached_adapters_route_every_role_through_the_rollout(tmp_path):
    run = build_run(train_config(*TEAM, "policy=lora_per_role"), tmp_path / "run")
    assert run.adapters_pending and set(run.routing.values()) == {"lora_base"}
    run.attach_adapters()
    assert set(run.rollout.policies) == {"tool", "plan"} and run.rollout.routing == {"tool": "tool", "plan": "plan"}


def test_a_decoupled_sub_trainer_builds_only_its_roles_policies(tmp_path):
    research = ["~experiment", *TINY, "env=research", "env.min_hops=2", "env.max_hops=2", "env.eval_size=2",
                "workflow=deep_research", "algorithm=m_grpo", "policy=per_role", "logger=none", "progress=false"]
    sub = build_run(train_config(*research, "trainer.role=sub", "store.path=" + str(tmp_path / "s.db")),
                    tmp_path / "sub")
    assert sub.role_map == {"main": "main", "sub": "sub"} and set(sub.policies) == {"sub"}
    both = build_run(train_config(*research), tmp_path / "all")
    assert set(both.policies) == set(both.role_map.values())
