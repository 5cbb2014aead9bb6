import math

import pytest
import torch

from marl_cli.algorithms.grpo import assign_advantages, group_advantages
from marl_cli.rollout.samples import Sample


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


def test_matches_trl_group_normalisation():
    """TRL's GRPOTrainer: A = (r − mean_g) / (nanstd_g + 1e-4) over consecutive groups of G."""
    from trl.trainer.utils import nanstd

    g = 4
    rewards = torch.tensor([0.1, 0.9, -1.0, 2.0, 3.0, 3.0, 1.0, 0.0, 5.0, -2.0, 0.3, 0.3])
    grouped = rewards.view(-1, g)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(g)
    std = nanstd(grouped, dim=1).repeat_interleave(g)
    trl_adv = (rewards - mean) / (std + 1e-4)
    ours = group_advantages(rewards.tolist(), [i // g for i in range(len(rewards))], eps=1e-4)
    assert ours == pytest.approx(trl_adv.tolist(), abs=1e-5)


def _sample(task, turn, role, reward):
    return Sample(task=task, branch=0, turn=turn, role=role, policy="p", prompt_ids=[1], completion_ids=[2],
                  reward=reward)


def test_groups_are_task_turn_role_and_filter():
    rows = [_sample(0, 0, "a", 1.0), _sample(0, 0, "a", 0.0), _sample(1, 0, "a", 1.0), _sample(1, 0, "a", 0.0),
            _sample(0, 0, "b", 2.0), _sample(0, 0, "b", 2.0)]
    stats = assign_advantages(rows, filter="zero_std")
    assert stats == {"groups": 3.0, "zero_std_fraction": pytest.approx(1 / 3)}
    assert [r.keep for r in rows] == [True, True, True, True, False, False]
    assert rows[0].advantage > 0 > rows[1].advantage
    with pytest.raises(ValueError, match="algorithm.filter"):
        assign_advantages(rows, filter="bogus")
