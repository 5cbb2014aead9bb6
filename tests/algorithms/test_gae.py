import math

import pytest
import torch

from marl_cli.algorithms.gae import (
    acting_order,
    gae,
    role_keys,
    sequence_gae,
    team_keys,
    turn_order,
    whiten,
)
from marl_cli.algorithms.grpo import role_episodes
from marl_cli.core.samples import Sample

NAN = float("nan")


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)


def test_gae_padded_row_and_truncated_row_by_hand():
    # γ = 0.9, λ = 0.8, γλ = 0.72
    # row 0: two real steps, terminal (bootstrap 0); the padding's reward and value are NaN and must not leak
    #   δ1 = 1 − 0.4 = 0.6                          A1 = 0.6
    #   δ0 = 0 + 0.9·0.4 − 0.5 = −0.14              A0 = −0.14 + 0.72·0.6 = 0.292
    # row 1: three real steps, truncated with bootstrap V = 2
    #   δ2 = 0.5 + 0.9·2 − 1.5 = 0.8                A2 = 0.8
    #   δ1 = 0 + 0.9·1.5 − 0.5 = 0.85               A1 = 0.85 + 0.72·0.8 = 1.426
    #   δ0 = 1 + 0.9·0.5 − 1 = 0.45                 A0 = 0.45 + 0.72·1.426 = 1.47672
    rewards = torch.stack([t(0.0, 1.0, NAN), t(1.0, 0.0, 0.5)])
    values = torch.stack([t(0.5, 0.4, NAN), t(1.0, 0.5, 1.5)])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv, ret = gae(rewards, values, mask, 0.9, 0.8, bootstrap=t(0.0, 2.0))
    close(adv, torch.stack([t(0.292, 0.6, 0.0), t(1.47672, 1.426, 0.8)]))
    close(ret, torch.stack([t(0.792, 1.0, 0.0), t(2.47672, 1.926, 2.3)]))


def test_gae_lambda_one_is_the_discounted_return_minus_the_value():
    # r = (1, 0, 2), V = (0.5, 1, 0.25), γ = 0.9
    # terminal:       G = (1 + 0.9·1.8, 0 + 0.9·2, 2) = (2.62, 1.8, 2)            A = G − V = (2.12, 0.8, 1.75)
    # bootstrap 1:    G = (1 + 0.9·2.61, 0 + 0.9·2.9, 2 + 0.9·1) = (3.349, 2.61, 2.9)   A = (2.849, 1.61, 2.65)
    rewards, values, mask = t(1.0, 0.0, 2.0).repeat(2, 1), t(0.5, 1.0, 0.25).repeat(2, 1), torch.ones(2, 3)
    adv, ret = gae(rewards, values, mask, 0.9, 1.0, bootstrap=t(0.0, 1.0))
    close(adv, torch.stack([t(2.12, 0.8, 1.75), t(2.849, 1.61, 2.65)]))
    close(ret, torch.stack([t(2.62, 1.8, 2.0), t(3.349, 2.61, 2.9)]))


def test_gae_lambda_zero_is_the_one_step_td_error():
    # δ2 = 2 − 0.25 = 1.75, δ1 = 0 + 0.9·0.25 − 1 = −0.775, δ0 = 1 + 0.9·1 − 0.5 = 1.4 (no bootstrap: terminal)
    adv, ret = gae(t(1.0, 0.0, 2.0)[None], t(0.5, 1.0, 0.25)[None], torch.ones(1, 3), 0.9, 0.0)
    close(adv, t(1.4, -0.775, 1.75)[None])
    close(ret, t(1.9, 0.225, 2.0)[None])


def test_gae_empty_row_and_masked_step_inside_a_row():
    rewards = torch.stack([t(1.0, NAN, 0.0), t(3.0, 3.0, 3.0)])
    values = torch.stack([t(0.5, NAN, 0.4), t(1.0, 1.0, 1.0)])
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]])
    adv, ret = gae(rewards, values, mask, 0.9, 0.8)
    # row 0 is the two-step row (1, 0) / (0.5, 0.4) with its middle skipped:
    #   A1 = 0 − 0.4 = −0.4,  A0 = 1 + 0.9·0.4 − 0.5 + 0.72·(−0.4) = 0.572;  the all-masked row is all 0
    close(adv, torch.stack([t(0.572, 0.0, -0.4), t(0.0, 0.0, 0.0)]))
    close(ret, torch.stack([t(1.072, 0.0, 0.0), t(0.0, 0.0, 0.0)]))


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2), 0.9, 0.8)


def test_whiten_by_hand():
    # masked entries 1, 2, 3, 4: mean 2.5, unbiased variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    values = torch.stack([t(1.0, 2.0, 3.0), t(4.0, 100.0, NAN)])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    out = whiten(values, mask, eps=0.0)
    s = math.sqrt(5 / 3)
    close(out, torch.stack([t(-1.5 / s, -0.5 / s, 0.5 / s), t(1.5 / s, 0.0, 0.0)]))
    chosen = out[mask.bool()]
    close(chosen.mean(), torch.tensor(0.0, dtype=torch.float64))
    close(chosen.std(correction=1), torch.tensor(1.0, dtype=torch.float64))
    close(whiten(values, mask, shift_mean=False, eps=0.0), torch.stack([t(2.5 - 1.5 / s, 2.5 - 0.5 / s, 2.5 + 0.5 / s),
                                                                        t(2.5 + 1.5 / s, 0.0, 0.0)]))
    torch.testing.assert_close(whiten(values, mask), out, rtol=0, atol=1e-8)  # ε = 1e-8 on a variance of 5/3


def test_whiten_needs_two_entries():
    with pytest.raises(ValueError, match="at least two"):
        whiten(t(1.0, 2.0), torch.tensor([1, 0]))


# MARFT's order for 2 agents and 3 turns: step k = agent k % 2 of turn k // 2; the score goes to the last agent.
# r = (0, 0, 0, 0, 0, 1), V = (0.2, 0.3, 0.4, 0.5, 0.6, 0.8), γ = 0.9, λ = 0.8, γ on every link (MARFT):
#   A5 = 1 − 0.8 = 0.2
#   A4 = 0.9·0.8 − 0.6 + 0.72·0.2 = 0.12 + 0.144 = 0.264
#   A3 = 0.9·0.6 − 0.5 + 0.72·0.264 = 0.04 + 0.19008 = 0.23008
#   A2 = 0.9·0.5 − 0.4 + 0.72·0.23008 = 0.05 + 0.1656576 = 0.2156576
#   A1 = 0.9·0.4 − 0.3 + 0.72·0.2156576 = 0.06 + 0.155273472 = 0.215273472
#   A0 = 0.9·0.3 − 0.2 + 0.72·0.215273472 = 0.07 + 0.15499689984 = 0.22499689984
MARFT_REWARDS = t(0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
MARFT_VALUES = t(0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
MARFT_NEXT = torch.tensor([1, 2, 3, 4, 5, -1])
MARFT_ADVANTAGES = t(0.22499689984, 0.215273472, 0.2156576, 0.23008, 0.264, 0.2)


def test_sequence_gae_marft_order_by_hand():
    adv, ret = sequence_gae(MARFT_REWARDS, MARFT_VALUES, MARFT_NEXT, 0.9, 0.8)
    close(adv, MARFT_ADVANTAGES)
    close(ret, MARFT_ADVANTAGES + MARFT_VALUES)


def test_sequence_gae_unsorted_steps_give_the_sorted_result():
    # stored order: steps 5, 0, 3, 4, 1, 2 of the chain above; step k's successor k + 1 at its stored index
    stored = [5, 0, 3, 4, 1, 2]
    next_index = torch.tensor([-1, 4, 3, 0, 5, 2])
    adv, ret = sequence_gae(MARFT_REWARDS[stored], MARFT_VALUES[stored], next_index, 0.9, 0.8)
    close(adv, MARFT_ADVANTAGES[stored])
    close(ret, (MARFT_ADVANTAGES + MARFT_VALUES)[stored])


def test_sequence_gae_truncated_chain_and_terminal_single_step():
    # chain 0 → 1, step 1 truncated with bootstrap 1: δ1 = 0.9·1 − 0.5 = 0.4 = A1,
    #   A0 = 0.9·0.5 − 0.5 + 0.72·0.4 = −0.05 + 0.288 = 0.238;  step 2 alone, terminal: A2 = 1 − 0.25 = 0.75
    adv, ret = sequence_gae(t(0.0, 0.0, 1.0), t(0.5, 0.5, 0.25), torch.tensor([1, -2, -1]), 0.9, 0.8,
                            bootstrap=t(NAN, 1.0, NAN))
    close(adv, t(0.238, 0.4, 0.75))
    close(ret, t(0.738, 0.9, 1.0))


@pytest.mark.parametrize(("next_index", "message"), [([1, 0], "cycle"), ([0], "cycle"), ([3, -1], "below"),
                                                     ([-3, -1], "below"), ([1, -2], "bootstrap")])
def test_sequence_gae_rejects_bad_links(next_index, message):
    n = len(next_index)
    with pytest.raises(ValueError, match=message):
        sequence_gae(torch.zeros(n), torch.zeros(n), torch.tensor(next_index), 0.9, 0.8)


def row(task, branch, turn, role, segment=0):
    return Sample(task=task, branch=branch, turn=turn, role=role, policy="p", prompt_ids=[], completion_ids=[],
                  reward=0.0, segment=segment)


def test_acting_order_and_turn_order_from_samples():
    # episode (0, 0): main t0, sub t1 and t2 (call 0), main t3, sub t4 (call 1); episode (0, 1): main t0 only
    rows = [row(0, 0, 3, "main"), row(0, 1, 0, "main"), row(0, 0, 1, "sub"), row(0, 0, 4, "sub", 1),
            row(0, 0, 0, "main"), row(0, 0, 2, "sub")]
    # team: 4 (main t0) → 2 (sub t1) → 5 (sub t2) → 0 (main t3) → 3 (sub t4) → end; 1 alone
    assert acting_order(team_keys(rows), {"main": 0, "sub": 1}).tolist() == [3, -1, 5, -1, 2, 0]
    # roles: main 4 → 0; sub call 0: 2 → 5; sub call 1: 3 alone; main of branch 1: 1 alone
    next_index = turn_order(role_keys(rows))
    assert next_index.tolist() == [-1, -1, 5, -1, 0, -1]
    for idx in role_episodes(rows):
        assert [next_index[i].item() for i in idx] == [*idx[1:], -1]


def test_acting_order_within_a_turn_by_position():
    keys = [("e", 1, "b"), ("e", 0, "b"), ("e", 1, "a"), ("e", 0, "a")]
    assert acting_order(keys, {"a": 0, "b": 1}).tolist() == [-1, 2, 0, 1]
    assert acting_order(keys, {"b": 0, "a": 1}).tolist() == [2, 3, -1, 0]


def test_chain_keys_reject_duplicates_and_unknown_roles():
    with pytest.raises(ValueError, match="share the position"):
        acting_order([("e", 0, "a"), ("e", 0, "a")], {"a": 0})
    with pytest.raises(ValueError, match=r"\['c'\]"):
        acting_order([("e", 0, "c")], {"a": 0})
    with pytest.raises(ValueError, match="share the position"):
        turn_order([("x", 1), ("x", 1)])
