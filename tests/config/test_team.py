"""Heterogeneous teams as settings (``config/team.py``): per-policy models and updates, per-role sampling, the
schedule of who trains and who acts for whom, and the one-line errors for each bad input."""

import pytest
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.team import Schedule, policy_model, policy_trainer, role_sampling
from marl_cli.config.validate import check_overrides
from marl_cli.plugins import register_configs
from marl_cli.training.build import sampling_from
from tests.helpers import FAST, train_config

TEAM = [*FAST, "workflow=tool_plan", "algorithm=at_grpo", "policy=per_role"]


def test_a_policy_changes_only_what_it_names():
    cfg = train_config(*TEAM, "+policy.models.tool.tiny.num_hidden_layers=3", "+policy.models.tool.dtype=bfloat16",
                       "+policy.trainers.plan.learning_rate=0.25", "+policy.trainers.plan.loss_type=dapo")
    tool, plan = policy_model(cfg, "tool"), policy_model(cfg, "plan")
    assert (tool.tiny.num_hidden_layers, tool.tiny.hidden_size, tool.dtype) == (3, 32, "bfloat16")
    assert (plan.tiny.num_hidden_layers, plan.dtype) == (1, "float32")  # FAST's tiny model, unchanged
    trained = policy_trainer(cfg, "plan")
    assert (trained.learning_rate, trained.loss_type, trained.epsilon) == (0.25, "dapo", 0.2)
    assert policy_trainer(cfg, "tool").learning_rate == cfg.trainer.learning_rate


def test_a_role_samples_with_its_changes_and_evaluates_at_the_eval_temperature():
    cfg = train_config(*TEAM, "+rollout.roles.plan.temperature=0.6", "+rollout.roles.plan.max_new_tokens=7",
                       "+rollout.roles.plan.stop=[END]", "+eval.roles.tool.temperature=0.3",
                       "+rollout.roles.tool.chat_template_kwargs.enable_thinking=false")
    assert role_sampling(cfg, "plan") == {"temperature": 0.6, "max_new_tokens": 7, "stop": ["END"]}
    assert role_sampling(cfg, "plan", evaluation=True) == {"max_new_tokens": 7, "stop": ["END"]}
    train, evaluation = sampling_from(cfg), sampling_from(cfg, evaluation=True)
    plan, tool = train.for_role("plan"), train.for_role("tool")
    assert (plan.temperature, plan.max_new_tokens, plan.stop) == (0.6, 7, ("END",))
    assert (tool.temperature, tool.max_new_tokens, tool.chat_template_kwargs) == (cfg.rollout.temperature, 12,
                                                                                 {"enable_thinking": False})
    assert (evaluation.for_role("plan").temperature, evaluation.for_role("plan").max_new_tokens) == (0.0, 7)
    assert evaluation.for_role("tool").temperature == 0.3
    assert train.key("plan") != train.key("tool") and train.key("tool") == sampling_from(cfg).key("tool")


def test_the_alternate_schedule_trains_one_policy_at_a_time_in_order():
    schedule = Schedule(("tool", "plan"), frozenset({"tool", "plan"}), alternate_every=2)
    assert [sorted(schedule.training(s)) for s in range(1, 7)] == [["tool"], ["tool"], ["plan"], ["plan"],
                                                                   ["tool"], ["tool"]]
    assert (schedule.steps_of("tool", 7), schedule.steps_of("plan", 7)) == (4, 3)
    frozen = Schedule(("a", "b", "c"), frozenset({"a", "c"}), alternate_every=1)  # b is frozen: never its turn
    assert [sorted(frozen.training(s)) for s in range(1, 5)] == [["a"], ["c"], ["a"], ["c"]]
    assert Schedule(("a", "b"), frozenset({"a", "b"})).training(5) == {"a", "b"}


def test_the_swap_schedule_moves_every_role_one_policy_along():
    schedule = Schedule(("p1", "p2"), frozenset({"p1", "p2"}), swap_every=3)
    base = {"pioneer": "p1", "observer": "p2"}
    assert [schedule.routing(base, s)["pioneer"] for s in range(0, 8)] == ["p1", "p1", "p1", "p1", "p2", "p2", "p2",
                                                                             "p1"]
    assert schedule.routing(base, 4) == {"pioneer": "p2", "observer": "p1"}
    three = Schedule(("a", "b", "c"), frozenset("abc"), swap_every=1)
    assert three.routing({"x": "a", "y": "b", "z": "c"}, 2) == {"x": "b", "y": "c", "z": "a"}


def test_schedule_of_a_config_reads_the_order_and_the_frozen_policies():
    cfg = train_config(*TEAM, "trainer.alternate_every=5", "trainer.alternate_order=[plan,tool]")
    schedule = Schedule.of(cfg, {"tool": "tool", "plan": "plan"})
    assert schedule.order == ("plan", "tool") and sorted(schedule.training(1)) == ["plan"]
    frozen = Schedule.of(train_config(*TEAM, "policy.frozen=[plan]"), {"tool": "tool", "plan": "plan"})
    assert frozen.trainable == {"tool"}


BAD = [
    (["+policy.trainers.planner.learning_rate=1e-4"],
     r"^policy.trainers names policies \['planner'\] that policy=per_role lacks; its policies: \['tool', 'plan'\]"),
    (["policy=shared", "+policy.models.tool.tiny.num_hidden_layers=2", "+policy.models.plan.tiny.num_hidden_layers=4"],
     r"^policy.models names policies \['plan', 'tool'\] that policy=shared lacks; .*policy=per_role\)$"),
    (["policy=lora_per_role", "+policy.models.planner.tiny.num_hidden_layers=2"],
     r"^policy.models names policies \['planner'\] that policy=lora_per_role lacks; its policies: \['tool', 'plan'\]"),
    (["policy=lora_per_role", "+policy.models.tool.tiny.hidden_sise=3"],
     r"^policy.models.tool.tiny.hidden_sise: no such key; valid keys: "),
    (["+policy.models.tool.tiny.hidden_sise=3"], r"^policy.models.tool.tiny.hidden_sise: no such key; valid keys: "),
    (["+policy.models.tool.system_prompts.tool=hi"], r"^policy.models.tool.system_prompts: not a key this can change"),
    (["+policy.trainers.tool.steps=3"], r"^policy.trainers.tool.steps: not a key this can change; valid keys: "),
    (["+policy.trainers.tool.learning_rate=-1"], r"^policy.trainers.tool.learning_rate=-1.0: must be > 0.0$"),
    (["+policy.trainers.tool.loss_type=ppo"], r"^policy.trainers.tool.loss_type: .*ppo"),
    (["+rollout.roles.planner.temperature=0.5"], r"^rollout.roles names roles \['planner'\] that the workflow lacks"),
    (["+eval.roles.plan.temprature=0.5"], r"^eval.roles.plan.temprature: not a key this can change; valid keys: "),
    (["+rollout.roles.plan.top_p=1.5"], r"^rollout.roles.plan.top_p=1.5: must be > 0.0 and <= 1.0$"),
    (["+rollout.roles.plan.temperature=0"], r"^rollout.roles.plan.temperature=0: training rollouts sample"),
    (["policy.frozen=[tool,plan]"], r"^nothing to train: policy.frozen=\['tool', 'plan'\]"),
    (["trainer.frozen_roles=[tool,plan]"], r"^nothing to train: "),
    (["policy.frozen=[tool]", "trainer.alternate_every=2"],
     r"^trainer.alternate_every=2 trains policies in turn; this run trains \['plan'\] \(it needs two or more\)$"),
    (["trainer.alternate_every=2", "trainer.alternate_order=[tool]"],
     r"^trainer.alternate_order=\['tool'\] must list each policy once"),
    (["policy=shared", "trainer.swap_roles_every=5"], r"^trainer.swap_roles_every=5 swaps roles between policies"),
    (["policy.frozen=[tooll]"], r"^policy.frozen names policies \['tooll'\]"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_every_bad_team_setting_is_one_line_before_any_model(overrides, message):
    register_configs()
    with pytest.raises(ConfigError, match=message) as caught:
        check_overrides("train", [*TEAM, *overrides])
    assert "\n" not in str(caught.value)


def test_a_frozen_team_with_no_steps_is_an_evaluation_setup():
    register_configs()
    check_overrides("train", [*TEAM, "policy.frozen=[tool,plan]", "trainer.steps=0"])
    assert OmegaConf.select(train_config(*TEAM), "policy.models") == {}


def test_a_run_saved_before_the_team_keys_existed_still_resumes():
    from marl_cli.config.validate import _differences

    saved = {"name": "per_role", "assignment": {}}
    assert list(_differences(saved, {**saved, "models": {}, "frozen": [], "scripted": {}}, "policy")) == []
    assert list(_differences(saved, {**saved, "models": {"tool": {"dtype": "bfloat16"}}}, "policy")) == [
        "policy.models (None -> {'tool': {'dtype': 'bfloat16'}})"]
