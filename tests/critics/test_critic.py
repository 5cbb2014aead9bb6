"""The critic: the positions it reads (against a plain forward pass of the unpadded row, in float64), its update
(the loss it minimises, its statistics, the target copy's Polyak step), an exact resume, and two processes
updating as one."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from marl_cli.algorithms.values import CriticBatch, Regression, Transition
from marl_cli.core.samples import Sample
from marl_cli.core.world import World
from marl_cli.critics.critic import Critic
from marl_cli.critics.losses import explained_variance
from marl_cli.critics.value_model import ValueModel
from tests.critics.test_value_model import float64_value_model
from tests.precision import after_adam, assert_rounding_close, rounding
from tests.training.rows.test_distributed import _in_two_processes

TERMS = 1000
"""An upper bound on the terms any value or gradient entry here accumulates (≤ 12 positions × widths ≤ 64)."""
LR = 1e-2


def _cfg(**over: Any) -> SimpleNamespace:
    base = {"learning_rate": LR, "weight_decay": 0.01, "max_grad_norm": 1.0, "mini_batch_size": 3, "epochs": 2,
            "value_clip": 0.2, "tau": 0.1, "targets": True}
    return SimpleNamespace(**{**base, **over})


def _rows(seed: int, n: int = 8) -> list[Sample]:
    """``n`` rows of 1–6 prompt and 1–6 completion tokens; row 2's completion is empty."""
    gen = random.Random(seed)
    return [Sample(task=i, branch=0, turn=0, role="agent", policy="shared",
                   prompt_ids=[gen.randrange(3, 60) for _ in range(gen.randint(1, 6))],
                   completion_ids=[] if i == 2 else [gen.randrange(3, 60) for _ in range(gen.randint(1, 6))],
                   reward=0.0) for i in range(n)]


@torch.no_grad()
def _direct(model: ValueModel, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """(L, heads) values of the unpadded row, from a forward pass of it alone."""
    ids = torch.tensor([prompt + completion])
    return model(ids, torch.ones_like(ids))[0]


def test_token_values_are_the_values_before_each_completion_token_whatever_the_padding():
    critic = Critic(float64_value_model(heads=2), _cfg(mini_batch_size=4))
    rows = _rows(0)
    batched, second = critic.token_values(rows), critic.token_values(rows, head=1)
    for row, values, values1 in zip(rows, batched, second, strict=True):
        p, c = len(row.prompt_ids), len(row.completion_ids)
        direct = _direct(critic.model, row.prompt_ids, row.completion_ids)
        assert len(values) == c
        if c:  # V(s_t) at the token before completion token t: the last prompt token for t = 0
            assert_rounding_close(torch.tensor(values, dtype=torch.float64), direct[p - 1:p + c - 1, 0], TERMS)
            assert_rounding_close(torch.tensor(values1, dtype=torch.float64), direct[p - 1:p + c - 1, 1], TERMS)
            alone = critic.token_values([row])[0]
            assert_rounding_close(torch.tensor(values, dtype=torch.float64),
                                  torch.tensor(alone, dtype=torch.float64), TERMS)


def test_state_and_action_values_read_the_last_prompt_and_the_last_completion_token():
    critic = Critic(float64_value_model(heads=3), _cfg(mini_batch_size=5))
    rows = _rows(1)
    states, actions = critic.state_values(rows), critic.action_values(rows)
    assert states.shape == actions.shape == (len(rows), 3)
    for i, row in enumerate(rows):
        p, c = len(row.prompt_ids), len(row.completion_ids)
        direct = _direct(critic.model, row.prompt_ids, row.completion_ids)
        assert_rounding_close(states[i], direct[p - 1], TERMS)
        assert_rounding_close(actions[i], direct[p + c - 1], TERMS)  # an empty completion: the state's
    assert critic.state_values([]).shape == (0, 3)


def test_next_state_values_read_the_next_prompt_and_are_zero_after_the_end():
    critic = Critic(float64_value_model(heads=2), _cfg())
    rows = _rows(2, n=4)
    transitions = [Transition(r.prompt_ids, r.completion_ids, 1.0, i == 3, None if i == 3 else rows[i + 1].prompt_ids,
                              0, "agent") for i, r in enumerate(rows)]
    values = critic.next_state_values(transitions)
    for i in range(3):
        assert_rounding_close(values[i], _direct(critic.model, rows[i + 1].prompt_ids, [])[-1], TERMS)
    assert values[3].tolist() == [0.0, 0.0]
    assert torch.equal(critic.next_state_values(transitions, target=True), values)  # the target starts as a copy


def test_the_update_minimises_the_summed_per_head_losses_at_their_positions():
    """ArCHer's layout: Q heads 0, 1 at the action, V heads 2, 3 at the state. One step (one epoch, one
    mini-batch) reports Σ over the heads of ½·mean over the rows of (V − y)², and a few updates lower it."""
    critic = Critic(float64_value_model(heads=4), _cfg(mini_batch_size=8, epochs=1, value_clip=None))
    rows = _rows(3)
    gen = torch.Generator().manual_seed(0)
    q, v = torch.rand(8, 2, generator=gen, dtype=torch.float64), torch.rand(8, 2, generator=gen, dtype=torch.float64)
    batch = CriticBatch(rows, [Regression("action", q, heads=(0, 1)), Regression("state", v, heads=(2, 3))])

    def loss() -> torch.Tensor:
        errors = torch.cat([critic.action_values(rows)[:, :2] - q, critic.state_values(rows)[:, 2:] - v], 1)
        return 0.5 * (errors ** 2).mean(0).sum()

    before = loss()
    stats = critic.update(batch, random.Random(0))
    assert stats["value_loss"] == pytest.approx(float(before), rel=rounding(TERMS))
    assert "value_clip_fraction" not in stats and stats["grad_norm"] > 0
    for step in range(1, 6):
        critic.update(batch, random.Random(step))
    assert float(loss()) < 0.5 * float(before)


def test_without_a_clip_the_update_reads_no_values_before_it_and_reports_those_of_its_first_pass():
    critic = Critic(float64_value_model(heads=1), _cfg(mini_batch_size=8, epochs=2, value_clip=None))
    rows, gen = _rows(6), random.Random(2)
    returns = [[gen.uniform(-1, 1) for _ in r.completion_ids] for r in rows]
    flat = torch.tensor([x for r in returns for x in r], dtype=torch.float64)
    old = torch.tensor([x for r in critic.token_values(rows) for x in r], dtype=torch.float64)
    passes: list[int] = []
    critic.model.trunk.embed_tokens.register_forward_hook(lambda m, args, out: passes.append(args[0].size(0)))
    stats = critic.update(CriticBatch(rows, [Regression("token", returns)]), random.Random(0))
    assert len(passes) == 2  # one forward a mini-batch (8 rows, 2 epochs), no read of V_old
    # one mini-batch an epoch: the first pass's values are the values before the update
    assert stats["td_error/mean"] == pytest.approx(float((flat - old).abs().mean()), rel=rounding(TERMS))
    assert stats["value/mean"] == pytest.approx(float(old.mean()), rel=rounding(TERMS))


def test_one_read_gives_state_and_action_values_and_the_td_values():
    critic = Critic(float64_value_model(heads=2), _cfg(mini_batch_size=16))
    rows = _rows(7, n=5)
    states, actions = critic.values_at(rows, ["state", "action"])
    assert_rounding_close(states, critic.state_values(rows), TERMS)
    assert_rounding_close(actions, critic.action_values(rows), TERMS)
    transitions = [Transition(r.prompt_ids, r.completion_ids, 1.0, i == 4, None if i == 4 else rows[i + 1].prompt_ids,
                              0, "agent") for i, r in enumerate(rows)]
    following, here = critic.td_values(transitions, target=True)
    assert_rounding_close(following, critic.next_state_values(transitions, target=True), TERMS)
    assert_rounding_close(here, critic.action_values(rows, target=True), TERMS)
    assert following[4].tolist() == [0.0, 0.0] and critic.td_values([])[1].shape == (0, 2)


def test_a_token_update_reports_the_values_before_it_and_lowers_the_loss():
    critic = Critic(float64_value_model(heads=1), _cfg(targets=False))
    rows = _rows(4)
    gen = random.Random(0)
    returns = [[gen.uniform(-1, 1) for _ in r.completion_ids] for r in rows]
    flat = torch.tensor([x for r in returns for x in r], dtype=torch.float64)

    def values() -> torch.Tensor:
        return torch.tensor([x for r in critic.token_values(rows) for x in r], dtype=torch.float64)

    old = values()
    stats = critic.update(CriticBatch(rows, [Regression("token", returns)]), random.Random(0))
    assert stats["td_error/mean"] == pytest.approx(float((flat - old).abs().mean()), rel=rounding(TERMS))
    assert stats["explained_variance"] == pytest.approx(explained_variance(old, flat, torch.ones_like(flat)),
                                                        rel=rounding(TERMS), abs=rounding(TERMS))
    assert stats["value/mean"] == pytest.approx(float(old.mean()), rel=rounding(TERMS))
    assert stats["target/std"] == pytest.approx(float(flat.std()), rel=rounding(TERMS))
    assert 0.0 <= stats["value_clip_fraction"] <= 1.0
    for step in range(1, 5):
        given = critic.token_values(rows)
        critic.update(CriticBatch(rows, [Regression("token", returns, old_values=given)]), random.Random(step))
    assert float(((values() - flat) ** 2).mean()) < 0.5 * float(((old - flat) ** 2).mean())
    with pytest.raises(ValueError, match="no target copy"):
        critic.soft_update()


def test_given_old_values_equal_the_ones_the_update_would_read():
    rows, gen = _rows(5), random.Random(1)
    returns = [[gen.uniform(-1, 1) for _ in r.completion_ids] for r in rows]
    read, given = (Critic(float64_value_model(heads=1), _cfg()) for _ in range(2))
    read.update(CriticBatch(rows, [Regression("token", returns)]), random.Random(0))
    old = given.token_values(rows)
    given.update(CriticBatch(rows, [Regression("token", returns, old_values=old)]), random.Random(0))
    for a, b in zip(read.model.parameters(), given.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_soft_update_moves_the_target_by_tau_toward_the_online_weights():
    critic = Critic(float64_value_model(heads=1), _cfg(tau=0.1))
    rows = _rows(6)
    start = critic.target.head.weight.detach().clone()
    critic.update(CriticBatch(rows, [Regression("state", torch.ones(8))]), random.Random(0))
    online = critic.model.head.weight.detach().clone()
    assert torch.equal(critic.target.head.weight, start) and not torch.equal(online, start)  # the update leaves it
    critic.soft_update()
    expected = start + 0.1 * (online - start)  # θ̄ ← θ̄ + τ·(θ − θ̄) = (1 − τ)·θ̄ + τ·θ
    assert_rounding_close(critic.target.head.weight.detach(), expected, 4)
    row = rows[0]  # target=True reads the target copy
    assert_rounding_close(critic.state_values([row], target=True)[0],
                          _direct(critic.target, row.prompt_ids, row.completion_ids)[len(row.prompt_ids) - 1], TERMS)


def test_a_batch_that_does_not_fit_its_rows_or_heads_is_a_value_error():
    critic = Critic(float64_value_model(heads=2), _cfg())
    rows = _rows(7, n=3)
    for regression, match in [(Regression("state", torch.ones(2)), "targets for 2 rows"),
                               (Regression("state", torch.ones(3), heads=(2,)), "out of the model's 2"),
                               (Regression("state", torch.ones(3, 2)), "2 targets for 1 positions"),
                               (Regression("middle", torch.ones(3)), "unknown critic position")]:
        with pytest.raises(ValueError, match=match):
            critic.update(CriticBatch(rows, [regression]), random.Random(0))
    assert critic.update(CriticBatch(rows[2:3], [Regression("token", [[]])]), random.Random(0)) == {}


def _batches(step: int) -> CriticBatch:
    rows, gen = _rows(10 + step), random.Random(step)
    returns = [[gen.uniform(-1, 1) for _ in r.completion_ids] for r in rows]
    return CriticBatch(rows, [Regression("token", returns)])


def test_a_critic_restored_from_its_state_updates_as_the_uninterrupted_one():
    straight = Critic(float64_value_model(heads=1), _cfg())
    for step in range(2):
        straight.update(_batches(step), random.Random(step))
        straight.soft_update()
    first = Critic(float64_value_model(heads=1), _cfg())
    first.update(_batches(0), random.Random(0))
    first.soft_update()
    state = copy.deepcopy(first.state_dict())
    resumed = Critic(float64_value_model(heads=1, seed=9), _cfg())  # another head: the state replaces it
    resumed.load_state_dict(state)
    resumed.update(_batches(1), random.Random(1))
    resumed.soft_update()
    for net in ("model", "target"):
        for (name, a), b in zip(getattr(straight, net).named_parameters(), getattr(resumed, net).parameters(),
                                strict=True):
            assert torch.equal(a, b), (net, name)


def _two_updates(tmp: str, world: World) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """A token update then an utterance update (two heads at two positions), and the weights after them."""
    critic = Critic(float64_value_model(heads=2), _cfg(), world)
    rows = _rows(20)
    targets = torch.linspace(-1, 1, 8, dtype=torch.float64)
    utterance = CriticBatch(rows, [Regression("state", targets, heads=(1,)), Regression("action", -targets)])
    stats = [critic.update(_batches(0), random.Random(0)), critic.update(utterance, random.Random(1))]
    return {k: v.clone() for k, v in critic.model.state_dict().items()}, stats


def test_two_processes_update_the_critic_as_one(tmp_path: Path):
    """Each mini-batch split across two gloo processes, their gradients averaged: the weights equal one process's
    up to float64 rounding through Adam (``after_adam``: 2 updates × 2 epochs × 3 mini-batches), and so do the
    loss and gradient norm."""
    weights2, stats2 = _in_two_processes(_two_updates, tmp_path)
    weights, stats = _two_updates(str(tmp_path), World())
    for key, value in weights.items():
        torch.testing.assert_close(weights2[key], value, atol=after_adam(LR, 12, TERMS), rtol=0, msg=key)
    for one, two in zip(stats, stats2, strict=True):
        assert one.keys() == two.keys()
        for key in ("value_loss", "grad_norm", "value_clip_fraction", "td_error/mean", "explained_variance"):
            assert two[key] == pytest.approx(one[key], rel=rounding(TERMS), abs=rounding(TERMS)), key
