"""Turn credit (``algorithm.turn_credit``, ``gamma``, ``norm_group``): discounted returns-to-go over a role's later
turns in its episode, the episode-wide normalisation group, and the settings they refuse."""

import math
from types import SimpleNamespace

import pytest

from marl_cli.algorithms.grpo import assign_advantages, grpo_estimator, turn_returns
from marl_cli.config.errors import ConfigError
from marl_cli.config.validate import check_config
from marl_cli.core.samples import Sample
from tests.helpers import FAST, train_config


def _row(branch: int, turn: int, reward: float, role: str = "a", task: int = 0, segment: int = 0) -> Sample:
    return Sample(task=task, branch=branch, turn=turn, role=role, policy="p", prompt_ids=[1], completion_ids=[2],
                  reward=reward, segment=segment)


def test_returns_discount_each_roles_later_turns_and_stop_where_its_episode_ends():
    rows = [_row(0, 2, 2.0), _row(0, 0, 1.0), _row(0, 1, 0.0),  # out of order on purpose
            _row(1, 0, 3.0),  # this episode ended after turn 0
            _row(0, 0, 1.0, role="b"), _row(0, 1, 1.0, role="b"),
            _row(0, 1, 4.0, segment=1)]  # another segment of role a: its own trajectory
    # branch 0, role a: G2 = 2, G1 = 0 + 0.5·2 = 1, G0 = 1 + 0.5·1 = 1.5; role b: G1 = 1, G0 = 1 + 0.5 = 1.5
    assert turn_returns(rows, 0.5) == [2.0, 1.5, 1.0, 3.0, 1.5, 1.0, 4.0]
    assert turn_returns(rows, 0.0) == [r.reward for r in rows]
    assert turn_returns(rows, 1.0)[:3] == [2.0, 3.0, 2.0]


def test_the_episode_group_normalises_every_turn_of_a_task_and_role_together():
    # one task, K = 4: episode 0 solves at turn 0 and ends; 1 solves at turn 1; 2 and 3 fail both turns
    rows = [_row(0, 0, 1.0), _row(1, 0, 0.0), _row(2, 0, 0.0), _row(3, 0, 0.0),
            _row(1, 1, 1.0), _row(2, 1, 0.0), _row(3, 1, 0.0)]
    stats = assign_advantages(rows, norm_by_std=False)  # per turn index: turn 1's baseline is its survivors' 1/3
    assert stats["turn0/advantage_mean"] == pytest.approx(0.0, abs=1e-15) and stats["turn1/rows"] == 3
    assert stats["turn1/advantage_mean"] == pytest.approx(0.0, abs=1e-15)
    assert [r.advantage for r in rows] == pytest.approx([0.75, -0.25, -0.25, -0.25, 2 / 3, -1 / 3, -1 / 3], abs=1e-12)
    stats = assign_advantages(rows, norm_by_std=False, by_turn=False)  # one baseline for all 7 rows: 2/7
    # solving at turn 1 is credited as solving at turn 0 (5/7); per turn index it got 2/3 against 3/4
    assert stats["turn0/advantage_mean"] == pytest.approx(-1 / 28, abs=1e-15)
    assert stats["turn1/advantage_mean"] == pytest.approx(1 / 21, abs=1e-15)
    assert [r.advantage for r in rows] == pytest.approx([5 / 7, -2 / 7, -2 / 7, -2 / 7, 5 / 7, -2 / 7, -2 / 7],
                                                        abs=1e-12)


def test_the_estimator_normalises_returns_when_asked():
    rows = [_row(b, t, r) for b, t, r in [(0, 0, 0.0), (0, 1, 1.0), (1, 0, 0.0), (1, 1, 0.0), (2, 0, 1.0)]]
    cfg = SimpleNamespace(turn_credit="return", gamma=0.9, norm_group="turn", norm_by_std=True, std_eps=0.0,
                          filter="none", batch_roles=[])
    _, stats = grpo_estimator(rows, cfg, None)
    returns = [0.9, 1.0, 0.0, 0.0, 1.0]  # turn 0: 0.9, 0, 1 (mean 19/30); turn 1: 1, 0
    mean = sum(returns[i] for i in (0, 2, 4)) / 3
    std = math.sqrt(sum((returns[i] - mean) ** 2 for i in (0, 2, 4)) / 2)
    assert rows[0].advantage == pytest.approx((0.9 - mean) / std, abs=1e-12)
    assert rows[1].advantage == pytest.approx(0.5 / math.sqrt(0.5), abs=1e-12)  # turn 1: 1 and 0
    assert stats["return_mean"] == pytest.approx(sum(returns) / 5, abs=1e-12)


@pytest.mark.parametrize(("overrides", "message"), [
    (["algorithm.gamma=0.9"], "algorithm.gamma=0.9 discounts returns only"),
    (["algorithm=at_grpo", "algorithm.turn_credit=return"], "tree rollouts branch at every turn"),
])
def test_turn_credit_it_cannot_give_is_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_config(train_config(*[o for o in FAST if not o.startswith("env.size")], *overrides))
    assert "\n" not in str(err.value)


def test_returns_with_independent_at_grpo_are_accepted():
    check_config(train_config(*FAST, "algorithm=at_grpo", "algorithm.mode=independent", "algorithm.turn_credit=return",
                              "algorithm.gamma=0.9", "algorithm.norm_group=episode"))


def test_a_run_saved_before_turn_credit_and_credit_existed_resumes_unless_they_change(tmp_path):
    """A saved config without the keys resumes with them at what runs did before; set otherwise, it is refused."""
    from omegaconf import OmegaConf

    from marl_cli.config.validate import check_resume

    cfg = train_config(*FAST)
    saved = OmegaConf.to_container(cfg, resolve=False)
    del saved["credit"]
    for key in ("turn_credit", "gamma", "norm_group"):
        del saved["algorithm"][key]
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(saved)))
    check_resume(cfg, tmp_path)
    with pytest.raises(ConfigError, match=r"changed: algorithm.turn_credit \(None -> 'return'\)"):
        check_resume(train_config(*FAST, "algorithm.turn_credit=return"), tmp_path)
    with pytest.raises(ConfigError, match=r"changed: credit \(None -> \{'name': 'hicra'"):
        check_resume(train_config(*FAST, "credit=hicra"), tmp_path)
