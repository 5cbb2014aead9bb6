import torch
from omegaconf import OmegaConf

from marl_cli.config.schema import ModelConfig, PlanPathConfig, WorkflowConfig
from marl_cli.envs.plan_path import PlanPathEnv
from marl_cli.policies.regime import build_policies
from marl_cli.rollout.engine import rollout_metrics, run_episodes
from marl_cli.rollout.generation import HFGenerator, Sampling
from marl_cli.workflows.single_agent import SingleAgentWorkflow
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
    result = run_episodes(workflow, policies, {"agent": "shared"}, tasks, 4, Sampling(1.0, max_new_tokens=6), gen)
    assert result.generate_calls == 1
    assert len(result.samples) == 20
    assert {(s.task, s.branch) for s in result.samples} == {(t, b) for t in range(5) for b in range(4)}
    prompts = {s.task: s.prompt_ids for s in result.samples}
    assert all(s.prompt_ids == prompts[s.task] for s in result.samples)  # a group shares one prompt
    assert all(1 <= len(s.completion_ids) <= 6 for s in result.samples)
    metrics = rollout_metrics(result, "train")
    assert metrics["train/generate_calls"] == 1
    assert 0 <= metrics["train/agent/format_failure"] <= 1


def test_batch_size_splits_generate_calls(tmp_path):
    env, workflow, policies = _setup(tmp_path)
    tasks = [env.task("train", i) for i in range(5)]
    gen = HFGenerator()
    result = run_episodes(workflow, policies, {"agent": "shared"}, tasks, 2,
                          Sampling(1.0, max_new_tokens=4, batch_size=4), gen)
    assert result.generate_calls == 3  # ceil(10 / 4)


def test_greedy_is_deterministic_and_scored_by_env(tmp_path):
    env, workflow, policies = _setup(tmp_path)
    tasks = [env.task("eval", i) for i in range(3)]
    runs = [run_episodes(workflow, policies, {"agent": "shared"}, tasks, 1, Sampling(0.0, max_new_tokens=8),
                         HFGenerator()) for _ in range(2)]
    assert [s.completion_ids for s in runs[0].samples] == [s.completion_ids for s in runs[1].samples]
    tok = policies["shared"].tokenizer
    for s in runs[0].samples:
        text = tok.decode(s.completion_ids, skip_special_tokens=True)
        expected = env.step(env.initial_state(tasks[s.task]), workflow.parse(text))
        assert s.reward == expected.reward and s.format_ok == expected.format_ok
