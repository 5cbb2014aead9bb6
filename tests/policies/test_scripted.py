"""Scripted roles: the built-in actors, a scripted role's rows in a rollout (no generate call, no token ids, the
pseudo-policy ``scripted:<actor>``), and the one-line refusals of ``policy.scripted`` before any model is built."""

import random
from types import SimpleNamespace

import pytest

from marl_cli.config.errors import ConfigError
from marl_cli.config.validate import check_overrides
from marl_cli.plugins import register_configs
from marl_cli.policies.scripted import ACTORS, NoTokens, scripted_actor, scripted_routing
from marl_cli.rollout.engine import Rollout, rollout_metrics
from marl_cli.rollout.generation import Sampling
from marl_cli.tracking.completions import completion_records
from tests.helpers import ScriptedGenerator
from tests.rollout.test_engine import _names, _plan_answer, _tool_plan

register_configs()
ORACLE_PLAN = {"tool": "tool", "plan": "scripted:oracle"}


def test_the_oracle_actor_answers_the_workflows_demonstration_and_empty_where_it_has_none(tmp_path):
    env, workflow = _tool_plan(tmp_path)
    state = workflow.initial_state(env.task("train", 0))
    for role in ("tool", "plan"):
        assert ACTORS.get("oracle")(workflow, role, state) == workflow.demonstration(role, state) != ""
    none = SimpleNamespace(demonstration=lambda role, state: None)
    assert ACTORS.get("oracle")(none, "plan", state) == ""
    assert ACTORS.get("empty")(workflow, "plan", state) == ""
    assert scripted_actor("scripted:empty") is ACTORS.get("empty") and scripted_actor("tool") is None
    assert scripted_routing(SimpleNamespace(scripted={"plan": "oracle"})) == {"plan": "scripted:oracle"}


@pytest.mark.parametrize("mode", ["independent", "tree"])
def test_a_scripted_roles_rows_carry_its_pseudo_policy_no_ids_and_make_no_generate_call(tmp_path, mode):
    env, workflow = _tool_plan(tmp_path, max_turns=2)
    tasks = [env.task("train", i) for i in range(3)]
    gen = ScriptedGenerator(_plan_answer)
    result = Rollout(workflow, _names("tool"), dict(ORACLE_PLAN), gen, Sampling(1.0), mode=mode).play(
        tasks, 2, random.Random(0))
    assert {name for name, _ in gen.batches} == {"tool"} and result.generate_calls == len(gen.batches)
    plan = [s for s in result.samples if s.role == "plan"]
    tool = [s for s in result.samples if s.role == "tool"]
    assert plan and len(plan) == len(tool)  # one scripted row per candidate, as for any role
    assert all(s.policy == "scripted:oracle" and s.completion_ids == [] and s.prompt_ids == []
               and s.sampling_logprobs == [] for s in plan)
    assert all(s.policy == "tool" and s.completion_ids for s in tool)
    assert all(s.success and s.format_ok for s in plan)  # the oracle's plan solves the real grid
    assert all(ep.success and ep.turns == 1 for ep in result.episodes)
    metrics = rollout_metrics(result, "train", workflow)
    assert metrics["train/plan/success"] == 1.0 and metrics["train/plan/completion_tokens"] == 0.0
    records = completion_records(result.samples, {"tool": NoTokens(), "scripted:oracle": NoTokens()}, 1, "train", 2)
    assert {r["policy"] for r in records if r["role"] == "plan"} == {"scripted:oracle"}


def test_an_empty_partner_never_helps(tmp_path):
    env, workflow = _tool_plan(tmp_path, max_turns=1)
    tasks = [env.task("train", i) for i in range(3)]
    result = Rollout(workflow, _names("tool"), {"tool": "tool", "plan": "scripted:empty"},
                     ScriptedGenerator(_plan_answer), Sampling(1.0)).play(tasks, 2)
    plan = [s for s in result.samples if s.role == "plan"]
    assert plan and not any(s.format_ok or s.success for s in plan)
    assert not any(ep.success for ep in result.episodes)


BASE = ["~experiment", "env=plan_path", "workflow=tool_plan", "policy=per_role"]


@pytest.mark.parametrize("overrides", [
    ["+policy.scripted.plan=oracle"],
    ["+policy.scripted.plan=empty", "policy=lora_per_role"],
    ["+policy.scripted.tool=oracle", "policy=shared", "trainer.frozen_roles=[tool]"],  # frozen and scripted: fine
])
def test_a_scripted_role_beside_a_learning_one_passes_the_checks(overrides):
    check_overrides("train", [*BASE, *overrides])


@pytest.mark.parametrize(("overrides", "message"), [
    (["+policy.scripted.boss=oracle"], r"^policy.scripted names roles \['boss'\] that the workflow lacks; roles: "),
    (["+policy.scripted.plan=nope"], r"^policy.scripted.plan='nope': no scripted actor of that name; choose from: "
                                     r"empty, first_legal, mcts, minimax, oracle, random \(a plug-in's\? name its "
                                     r"module in MARL_PLUGINS\)$"),
    (["+policy.scripted={tool: oracle, plan: empty}"], r"^policy.scripted scripts every role \['tool', 'plan'\]: "
                                                       r"no model is left"),
    (["+policy.scripted.plan=oracle", "+policy.assignment.plan=tool"],
     r"^policy.assignment gives the scripted roles \['plan'\] a policy; a role is scripted"),
    (["+policy.scripted.plan=oracle", "trainer.frozen_roles=[tool]"], r"^nothing to train: "),
])
def test_scripted_roles_that_cannot_run_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_overrides("train", [*BASE, *overrides])
    assert "\n" not in str(err.value)


def test_decoupled_trainers_with_a_scripted_role_are_refused():
    with pytest.raises(ConfigError, match=r"^trainer.role=main: decoupled trainers .* with trainer.role=all$"):
        check_overrides("train", ["experiment=toy/research_mgrpo", "trainer.role=main", "+policy.scripted.sub=oracle"])
