"""The value-based estimators on rows whose critic values are given: PPO's token-level GAE over a role's turns,
MARFT's GAE along the team's acting order, ArCHer's Q − V, against hand-computed values; and the rules between an
algorithm and its critic, checked before anything is built."""

import random

import pytest
from omegaconf import OmegaConf

from marl_cli.algorithms.archer import archer_estimator
from marl_cli.algorithms.marft import acting_positions, marft_estimator
from marl_cli.algorithms.ppo import GAEConfig, ppo_estimator
from marl_cli.config.errors import ConfigError
from marl_cli.config.validate import check_overrides
from marl_cli.core.samples import Sample
from marl_cli.plugins import register_configs
from tests.helpers import FAST

register_configs()


def _row(task, turn, role="agent", tokens=1, reward=0.0, values=(), value=None, q_value=None, branch=0):
    estimates = {"values": list(values), "value": value, "q_value": q_value}
    return Sample(task=task, branch=branch, turn=turn, role=role, policy="shared", prompt_ids=[3],
                  completion_ids=[5] * tokens, reward=reward,
                  estimates={k: v for k, v in estimates.items() if v not in (None, [])})


def _cfg(**kw):
    return OmegaConf.structured(GAEConfig(**{"name": "ppo", **kw}))


def test_ppo_runs_gae_over_a_roles_turns_as_one_token_sequence():
    # trajectory (task 0): turn 0 (2 tokens, reward 1 on its last), turn 1 (1 token, reward 2); task 1: one token
    rows = [_row(0, 1, reward=2.0, values=[1.0]), _row(1, 0, reward=-1.0, values=[0.3]),
            _row(0, 0, tokens=2, reward=1.0, values=[0.5, 0.2])]
    ppo_estimator(rows, _cfg(gamma=0.9, lam=0.8, whiten=False), random.Random(0))
    # δ2 = 2 − 1 = 1, A2 = 1; δ1 = 1 + 0.9·1 − 0.2 = 1.7, A1 = 1.7 + 0.72·1 = 2.42;
    # δ0 = 0.9·0.2 − 0.5 = −0.32, A0 = −0.32 + 0.72·2.42 = 1.4224; task 1: A = −1 − 0.3 = −1.3
    assert rows[2].token_advantages == pytest.approx([1.4224, 2.42])
    assert rows[0].token_advantages == pytest.approx([1.0])
    assert rows[1].token_advantages == pytest.approx([-1.3])
    returns = [s.estimates["returns"] for s in rows]
    assert returns[2] == pytest.approx([1.9224, 2.62]) and returns[0] == pytest.approx([2.0])
    assert rows[1].estimates["returns"] == pytest.approx([-1.0])
    assert rows[2].advantage == pytest.approx((1.4224 + 2.42) / 2)


def test_ppo_whitens_over_the_steps_tokens_and_needs_token_values():
    rows = [_row(0, 0, tokens=2, reward=1.0, values=[0.5, 0.2]), _row(1, 0, reward=-1.0, values=[0.3])]
    ppo_estimator(rows, _cfg(gamma=1.0, lam=1.0), random.Random(0))
    tokens = [a for s in rows for a in s.token_advantages]
    mean = sum(tokens) / 3
    assert mean == pytest.approx(0.0, abs=1e-12)
    assert sum((a - mean) ** 2 for a in tokens) / 2 == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(ValueError, match=r"has 1 critic values for 2 completion tokens: algorithm=ppo reads "):
        ppo_estimator([_row(0, 0, tokens=2, values=[0.1])], _cfg(), random.Random(0))


def test_marft_runs_gae_agent_after_agent_and_turn_after_turn():
    # episode (task 0, branch 0): a, b at turn 0, then a, b at turn 1; branch 1's rows interleaved
    rows = [_row(0, 0, "a", value=0.1), _row(0, 0, "a", value=9.0, reward=5.0, branch=1),
            _row(0, 0, "b", value=0.2, reward=1.0), _row(0, 1, "a", value=0.3), _row(0, 1, "b", value=0.4, reward=2.0),
            _row(0, 0, "b", value=9.0, branch=1)]
    assert acting_positions(rows) == {"a": 0, "b": 1}
    marft_estimator(rows, _cfg(name="marft", gamma=0.5, lam=1.0, whiten=False), random.Random(0))
    # λ = 1: R = the discounted returns along a0 → b0 → a1 → b1: 0.75, 1.5, 1, 2; A = R − V
    episode = [rows[i] for i in (0, 2, 3, 4)]
    assert [s.estimates["returns"][0] for s in episode] == pytest.approx([0.75, 1.5, 1.0, 2.0])
    assert [s.advantage for s in episode] == pytest.approx([0.65, 1.3, 0.7, 1.6])
    assert [rows[1].estimates["returns"][0], rows[5].estimates["returns"][0]] == pytest.approx([5.0, 0.0])
    rows = [_row(0, 0, "a", value=0.1), _row(0, 0, "b", value=0.2, reward=1.0)]
    marft_estimator(rows, _cfg(name="marft", gamma=0.5, lam=0.5, whiten=False), random.Random(0))
    # δ_b = 1 − 0.2 = 0.8; δ_a = 0.5·0.2 − 0.1 = 0; A_a = 0 + 0.25·0.8 = 0.2
    assert [s.advantage for s in rows] == pytest.approx([0.2, 0.8])


def test_archer_credits_q_minus_v():
    rows = [_row(0, 0, value=0.25, q_value=1.0), _row(0, 1, value=0.5, q_value=-0.5)]
    _, stats = archer_estimator(rows, None, random.Random(0))
    assert [s.advantage for s in rows] == [0.75, -1.0]
    assert stats == {"value_mean": 0.375, "q_mean": 0.25}
    with pytest.raises(ValueError, match="has no critic Q value: algorithm=archer reads critic=utterance"):
        archer_estimator([_row(0, 0, value=0.1)], None, random.Random(0))


@pytest.mark.parametrize("overrides", [
    ["algorithm=ppo", "critic=token"],
    ["algorithm=marft", "critic=utterance", "critic.scope=team", "algorithm.lam=0.9"],
    ["algorithm=archer", "critic=utterance", "critic.tau=0.05", "critic.replay_capacity=500"],
])
def test_each_value_algorithm_composes_with_its_critic(overrides):
    check_overrides("train", [*FAST, *overrides])


@pytest.mark.parametrize("overrides,message", [
    ("algorithm=ppo", "algorithm=ppo learns a token-level value model: add critic=token"),
    ("algorithm=archer critic=token", "algorithm=archer learns a utterance-level value model: use critic=utterance"),
    ("critic=token", "critic=token: algorithm=grpo is critic-free; a value model is read by algorithm=archer "
     "(critic=utterance), marft (critic=utterance), ppo (critic=token)"),
    ("critic.learning_rate=1", "critic.learning_rate=1.0 is not used by algorithm=grpo (critic=none)"),
    ("algorithm=ppo critic=token critic.tau=0.5", "critic.tau=0.5 is not used by algorithm=ppo"),
    ("algorithm=archer critic=utterance critic.epochs=2", "critic.epochs=2 is not used by algorithm=archer"),
    ("algorithm=ppo critic=token algorithm.turn_credit=return", "algorithm.turn_credit is a setting of "
     "algorithm=at_grpo, algorithm=grpo, not of algorithm=ppo"),
    ("algorithm=ppo critic=token critic.warmup_steps=50 trainer.steps=50", "critic.warmup_steps=50: the policies "
     "would never train in trainer.steps=50"),
    ("algorithm=ppo critic=token +critic.model.foo=1", "critic.model.foo: not a key this can change"),
    ("algorithm=ppo critic=token algorithm.lam=1.5", "algorithm.lam=1.5: must be >= 0.0 and <= 1.0"),
    ("algorithm=ppo critic=token critic.scope=everyone", "critic.scope: Invalid value 'everyone'"),
    ("algorithm=ppo critic=token algorithm.mode=tree", "algorithm.mode=tree is not defined for algorithm=ppo"),
    ("algorithm=ppo critic=token critic.share_trunk=true critic.scope=team",
     "critic.share_trunk=true needs critic.scope=policy"),
    ("algorithm=ppo critic=token critic.share_trunk=true +critic.model.dtype=float32",
     "critic.share_trunk=true puts the head on the policy's model: leave critic.model empty"),
    ("algorithm=ppo critic=token critic.share_trunk=true policy=lora_per_role",
     "critic.share_trunk=true needs full-model policies"),
    ("algorithm=ppo critic=token critic.share_trunk=true trainer.frozen_roles=[agent]",
     "critic.share_trunk=true would train a policy its schedule holds still"),
])
def test_a_critic_that_does_not_fit_is_a_one_line_error(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_overrides("train", [*FAST, *overrides.split()])
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)
