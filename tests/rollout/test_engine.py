import random
from collections import defaultdict
from types import SimpleNamespace

import torch
from omegaconf import OmegaConf

from marl_cli.config.schema import ModelConfig, PlanPathConfig, SandboxConfig, WorkflowConfig
from marl_cli.core.samples import Sample
from marl_cli.envs.plan_path import PlanPathEnv
from marl_cli.policies.regime import build_policies
from marl_cli.rollout.engine import Rollout, rollout_metrics, row_metrics, select
from marl_cli.rollout.generation import HFGenerator, Sampling, encode_prompts
from marl_cli.sandbox import Sandbox
from marl_cli.workflows.single_agent import SingleAgentWorkflow
from marl_cli.workflows.tool_plan import ToolPlanWorkflow
from tests.helpers import ScriptedGenerator
from tests.policies.test_tiny import SMALL


def _setup(tmp_path):
    env = PlanPathEnv(PlanPathConfig(size=4))
    workflow = SingleAgentWorkflow(OmegaConf.structured(WorkflowConfig(name="single_agent")), env)
    model_cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    policies = build_policies({"agent": "shared"}, model_cfg, 0, tmp_path, torch.device("cpu"))
    return env, workflow, policies


def test_one_batched_call_per_policy_turn_and_rows(tmp_path):
    env, workflow, policies = _setup(tmp_path)
    tasks = [env.task("train", i) for i in range(5)]
    gen = HFGenerator()
    result = Rollout(workflow, policies, {"agent": "shared"}, gen, Sampling(1.0, max_new_tokens=6)).play(tasks, 4)
    assert result.generate_calls == 1
    assert len(result.samples) == 20
    assert {(s.task, s.branch) for s in result.samples} == {(t, b) for t in range(5) for b in range(4)}
    prompts = {s.task: s.prompt_ids for s in result.samples}
    assert all(s.prompt_ids == prompts[s.task] for s in result.samples)  # a group shares one prompt
    assert all(1 <= len(s.completion_ids) <= 6 for s in result.samples)
    metrics = rollout_metrics(result, "train", workflow)
    assert metrics["train/generate_calls"] == 1
    assert 0 <= metrics["train/agent/format_failure"] <= 1


def test_batch_size_splits_generate_calls(tmp_path):
    env, workflow, policies = _setup(tmp_path)
    tasks = [env.task("train", i) for i in range(5)]
    gen = HFGenerator()
    result = Rollout(workflow, policies, {"agent": "shared"}, gen, Sampling(1.0, max_new_tokens=4, batch_size=4)).play(
        tasks, 2)
    assert result.generate_calls == 3  # ceil(10 / 4)


def test_greedy_is_deterministic_and_scored_by_env(tmp_path):
    env, workflow, policies = _setup(tmp_path)
    tasks = [env.task("eval", i) for i in range(3)]
    runs = [Rollout(workflow, policies, {"agent": "shared"}, HFGenerator(), Sampling(0.0, max_new_tokens=8)).play(
        tasks, 1) for _ in range(2)]
    assert [s.completion_ids for s in runs[0].samples] == [s.completion_ids for s in runs[1].samples]
    tok = policies["shared"].tokenizer
    for s in runs[0].samples:
        text = tok.decode(s.completion_ids, skip_special_tokens=True)
        expected = env.step(env.initial_state(tasks[s.task]), workflow.parse(text))
        assert s.reward == expected.reward + env.score(expected.state) and s.format_ok == expected.format_ok


PLANS = ["#### D", "#### R", "#### D D R R", "#### U", "#### L L", "no marker"]


def _plan_answer(policy, prompt, rng):
    if "Write Python" in prompt:
        return f"#### print({rng.choice(PLANS)[5:]!r})"
    return rng.choice(PLANS)


def _tool_plan(tmp_path, max_turns=3):
    env = PlanPathEnv(PlanPathConfig(size=4, actions_per_episode=max_turns),
                      sandbox=Sandbox(SandboxConfig(timeout_s=5)))
    cfg = OmegaConf.structured(WorkflowConfig(name="tool_plan", roles=["tool", "plan"], max_turns=max_turns,
                                              prompts={"tool": "{observation}\nWrite Python {marker}",
                                                       "plan": "{observation}\ntool: {tool}\n{marker}"}))
    return env, ToolPlanWorkflow(cfg, env)


def _names(*names):
    return {n: SimpleNamespace(name=n) for n in names}


def test_tree_groups_share_one_prompt_and_candidates_are_scored_separately(tmp_path):
    env, workflow = _tool_plan(tmp_path)
    tasks = [env.task("train", i) for i in range(4)]
    k = 6
    result = Rollout(workflow, _names("shared"), {"tool": "shared", "plan": "shared"}, ScriptedGenerator(_plan_answer),
                     Sampling(1.0), mode="tree").play(tasks, k, random.Random(0))
    groups = defaultdict(list)
    for s in result.samples:
        groups[s.task, s.turn, s.role].append(s)
    assert all(len(rows) == k for rows in groups.values())
    assert all(len({tuple(s.prompt_ids) for s in rows}) == 1 for rows in groups.values())
    for (task, _, _), rows in groups.items():  # a group's prompt shows its own task's grid
        grid = env.observe(env.initial_state(tasks[task]))
        assert grid.split("\n")[0].replace("S", ".") in "".join(map(chr, rows[0].prompt_ids)).replace("S", ".")
    plan_groups = [rows for (_, _, role), rows in groups.items() if role == "plan"]
    assert any(len({s.reward for s in rows}) > 1 for rows in plan_groups)  # later agent's K rewards differ
    for ep in result.episodes:  # the best plan advanced the real state: its success is the episode's
        if ep.success:
            assert any(s.success for s in groups[ep.task, ep.turns - 1, "plan"])


def test_greedy_selection_advances_the_best_candidate():
    outcomes = [SimpleNamespace(reward=r) for r in (0.1, 0.9, -1.0, 0.9)]
    rng = random.Random(0)
    picks = {select(outcomes, "greedy", rng) for _ in range(50)}
    assert picks == {1, 3}  # ties broken at random, never a worse candidate
    assert len({select(outcomes, "random", rng) for _ in range(200)}) == 4


def test_timeout_is_not_a_success(tmp_path):
    env, workflow = _tool_plan(tmp_path, max_turns=2)
    tasks = [env.task("train", i) for i in range(3)]
    gen = ScriptedGenerator(lambda *a: "#### print('U')" if "Python" in a[1] else "#### U")
    result = Rollout(workflow, _names("shared"), {"tool": "shared", "plan": "shared"}, gen, Sampling(1.0),
                     mode="tree").play(tasks, 2)
    assert all(ep.turns == 2 and ep.done and not ep.success for ep in result.episodes)
    assert rollout_metrics(result, "train", workflow)["train/success"] == 0.0


def test_generate_calls_per_stage_equal_the_policies_acting_whatever_the_task_count(tmp_path):
    env, workflow = _tool_plan(tmp_path, max_turns=1)
    for role_map, per_turn in (({"tool": "shared", "plan": "shared"}, 2),  # sequential: one call per stage
                               ({"tool": "tool", "plan": "plan"}, 2)):
        for n_tasks in (1, 5):
            tasks = [env.task("train", i) for i in range(n_tasks)]
            gen = ScriptedGenerator(_plan_answer)
            result = Rollout(workflow, _names(*set(role_map.values())), role_map, gen, Sampling(1.0),
                             mode="tree").play(tasks, 3)
            assert result.calls_per_turn == [per_turn]
            assert [name for name, _ in gen.batches] == [role_map["tool"], role_map["plan"]]


class ParallelWorkflow(SingleAgentWorkflow.__base__):
    """Two roles acting in one stage on the same state (like coder and tester)."""

    def stages(self, turn):
        return [self.roles]

    def act(self, role, state, text):
        return self.outcome(state.with_note(role, text), float(len(text)), True, team=0.0)

    def demonstration(self, role, state):
        return None


def test_parallel_roles_on_one_policy_share_one_call_and_see_the_same_state():
    env = PlanPathEnv(PlanPathConfig(size=4))
    cfg = OmegaConf.structured(WorkflowConfig(name="parallel", roles=["coder", "tester"], max_turns=2,
                                              prompt="{role} {coder} {tester}"))
    workflow = ParallelWorkflow(cfg, env)
    tasks = [env.task("train", i) for i in range(4)]
    shared = Rollout(workflow, _names("shared"), {"coder": "shared", "tester": "shared"},
                     ScriptedGenerator(lambda *a: "x" * a[2].randint(1, 4)), Sampling(1.0), mode="tree").play(tasks, 3)
    assert shared.calls_per_turn == [1, 1]
    split = Rollout(workflow, _names("a", "b"), {"coder": "a", "tester": "b"}, ScriptedGenerator(lambda *a: "y"),
                    Sampling(1.0), mode="independent").play(tasks, 3)
    assert split.calls_per_turn == [2, 2]
    first = [s for s in shared.samples if s.turn == 0]
    assert {"".join(map(chr, s.prompt_ids)).split(" ", 1)[1] for s in first} == {"none none"}


def test_system_prompts_and_template_kwargs_reach_the_prompt(tmp_path):
    model_cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    policy = build_policies({"agent": "shared"}, model_cfg, 0, tmp_path, torch.device("cpu"))["shared"]
    policy.tokenizer.chat_template = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                                      "{% if enable_thinking is defined and not enable_thinking %}[nothink]{% endif %}"
                                      "[assistant]")
    sampling = Sampling(0.0, system_prompts={"agent": "Be brief."}, chat_template_kwargs={"enable_thinking": False})
    ids, _ = encode_prompts(policy, ["go"], sampling.for_role("agent"))
    assert policy.tokenizer.decode(ids[0]) == "[system]Be brief.[user]go[nothink][assistant]"
    ids, _ = encode_prompts(policy, ["go"], sampling.for_role("other"))
    assert policy.tokenizer.decode(ids[0]) == "[user]go[nothink][assistant]"


def test_a_shared_reward_is_reported_beside_each_agents_own():
    rows = [Sample(0, b, 0, role, role, [1], [2], reward=1.5, info={"own": own})
            for b, (role, own) in enumerate([("pioneer", 0.5), ("observer", 1.0), ("pioneer", 1.5)])]
    metrics = row_metrics(rows, "train")
    assert metrics["train/pioneer/reward"] == metrics["train/observer/reward"] == 1.5
    assert (metrics["train/pioneer/own_reward"], metrics["train/observer/own_reward"]) == (1.0, 1.0)
    assert "train/solo/own_reward" not in row_metrics([Sample(0, 0, 0, "solo", "s", [1], [2], 1.0)], "train")
