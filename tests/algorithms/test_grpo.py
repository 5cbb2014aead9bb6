import math

import pytest
import torch

from marl_cli.algorithms.grpo import assign_advantages, group_advantages
from marl_cli.core.samples import Sample


def test_hand_computed_values():
    # group a: rewards 1, 2, 3 -> mean 2, unbiased std 1 -> advantages -1, 0, 1
    # group b: rewards 0, 4 -> mean 2, std sqrt(8) -> -2/sqrt(8), 2/sqrt(8)
    adv = group_advantages([1, 2, 3, 0, 4], ["a", "a", "a", "b", "b"], eps=0.0)
    assert adv == pytest.approx([-1, 0, 1, -2 / math.sqrt(8), 2 / math.sqrt(8)])


def test_dr_grpo_form_and_singletons():
    adv = group_advantages([1.0, 3.0, 5.0], ["a", "a", "solo"], norm_by_std=False)
    assert adv == [-1.0, 1.0, 0.0]


def test_zero_variance_group_is_zero():
    assert group_advantages([0.5, 0.5, 0.5], [0, 0, 0]) == [0.0, 0.0, 0.0]


def test_matches_trl_group_normalisation(tmp_path):
    """TRL's GRPOTrainer scores completions and normalises rewards itself; ours must agree (TRL's ε is 1e-4)."""
    from datasets import Dataset
    from omegaconf import OmegaConf
    from trl import GRPOConfig, GRPOTrainer

    from marl_cli.config.schema import ModelConfig
    from marl_cli.policies.regime import build_policies
    from tests.policies.test_tiny import SMALL

    g = 4
    rewards = [0.1, 0.9, -1.0, 2.0, 3.0, 3.0, 1.0, 0.0]
    policy = build_policies({"a": "p"}, OmegaConf.structured(ModelConfig(tiny=SMALL)), 0, tmp_path,
                            torch.device("cpu"))["p"]
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), num_generations=g, per_device_train_batch_size=len(rewards),
                      max_completion_length=4, use_cpu=True, report_to="none", gradient_checkpointing=False)

    def given_reward(prompts, completions, r, **kwargs):
        return r

    trainer = GRPOTrainer(model=policy.model, args=args, processing_class=policy.tokenizer,
                          reward_funcs=[given_reward], train_dataset=Dataset.from_dict({"prompt": ["x"], "r": [0.0]}))
    trainer.model.train()
    inputs = [{"prompt": f"task {i // g}", "r": r} for i, r in enumerate(rewards)]
    trl_adv = trainer._generate_and_score_completions(inputs)["advantages"].tolist()
    ours = group_advantages(rewards, [i // g for i in range(len(rewards))], eps=1e-4)
    assert ours == pytest.approx(trl_adv, abs=1e-5)
    # by hand, group 2 = [3, 3, 1, 0]: mean 1.75, unbiased std 1.5
    assert ours[4:] == pytest.approx([1.25 / 1.5001, 1.25 / 1.5001, -0.75 / 1.5001, -1.75 / 1.5001])


def _sample(task, turn, role, reward):
    return Sample(task=task, branch=0, turn=turn, role=role, policy="p", prompt_ids=[1], completion_ids=[2],
                  reward=reward)


def test_groups_are_task_turn_role_and_filter():
    rows = [_sample(0, 0, "a", 1.0), _sample(0, 0, "a", 0.0), _sample(1, 0, "a", 1.0), _sample(1, 0, "a", 0.0),
            _sample(0, 0, "b", 2.0), _sample(0, 0, "b", 2.0)]
    stats = assign_advantages(rows, filter="zero_std")
    assert stats == {"groups": 3.0, "zero_std_fraction": pytest.approx(1 / 3), "a/zero_std_fraction": 0.0,
                     "b/zero_std_fraction": 1.0}
    assert [r.keep for r in rows] == [True, True, True, True, False, False]
    assert rows[0].advantage > 0 > rows[1].advantage


def test_tasks_never_share_a_group_even_with_equal_prompts_and_turns():
    rows = [_sample(t, 0, "a", r) for t, r in ((0, 1.0), (0, 0.0), (1, 5.0), (1, 5.0))]
    assign_advantages(rows)
    assert [r.advantage for r in rows[2:]] == [0.0, 0.0]  # task 1 is its own zero-variance group
    assert rows[0].advantage == pytest.approx(1 / (2 ** -0.5 + 1e-6) / 2)
