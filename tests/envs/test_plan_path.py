import random
from collections import deque

import pytest

from marl_cli.config.schema import PlanPathConfig
from marl_cli.envs.base import EVAL_SEED_BASE, task_seed
from marl_cli.envs.plan_path import Grid, PlanPathEnv, parse_moves, random_grid, shortest_path


def grid_from(rows: list[str]) -> Grid:
    """'S' start, 'G' goal, '#' wall, '.' free."""
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    find = lambda ch: next(k for k, v in cells.items() if v == ch)  # noqa: E731
    return Grid(len(rows), frozenset(k for k, v in cells.items() if v == "#"), find("S"), find("G"))


def make_env(**kw) -> PlanPathEnv:
    return PlanPathEnv(PlanPathConfig(**{"shaping": False, "stop_at_goal": False, **kw}))


def play(env: PlanPathEnv, grid: Grid, action: str | None):
    return env.step(env.initial_state(grid), action)


GRID = grid_from(["S.#", "..#", "..G"])  # optimal path: 4 moves, e.g. D D R R


def test_optimal_path_reward():
    t = play(make_env(), GRID, "D D R R")
    assert t.success and t.done and t.format_ok
    assert t.reward == pytest.approx(4 * -0.01 + 1.0 + 0.5)


def test_suboptimal_path_gets_no_bonus():
    t = play(make_env(), GRID, "R D L D R R")  # 6 moves
    assert t.success
    assert t.reward == pytest.approx(6 * -0.01 + 1.0)


def test_invalid_moves_cost_and_do_not_move():
    t = play(make_env(), GRID, "U L D D R R")  # U and L leave the grid: 2 invalid, then the optimal 4
    assert t.success and t.info["invalid_moves"] == 2
    assert t.state.moves_made == 4
    assert t.reward == pytest.approx(2 * -0.1 + 4 * -0.01 + 1.0 + 0.5)


def test_wall_is_invalid():
    t = play(make_env(), GRID, "R R")  # second R hits the wall at (0, 2)
    assert not t.success
    assert t.state.pos == (0, 1)
    assert t.reward == pytest.approx(-0.01 - 0.1 - 1.0)


def test_plan_must_end_on_the_goal():
    t = play(make_env(), GRID, "D D R R U")  # U from the goal hits the wall at (1, 2): the plan ends there
    assert t.success and t.info["invalid_moves"] == 1
    t = play(make_env(), GRID, "D D R R L")  # walks on past the goal
    assert not t.success and t.state.pos == (2, 1)
    assert t.reward == pytest.approx(5 * -0.01 - 1.0)
    t = play(make_env(), GRID, "D D R R L R")  # leaves and comes back: success, but not a shortest plan
    assert t.success and t.reward == pytest.approx(6 * -0.01 + 1.0)


def test_stop_at_goal_ignores_later_moves():
    assert PlanPathConfig().stop_at_goal  # the paper's rule is the default
    t = play(make_env(stop_at_goal=True), GRID, "D D R R L L")
    assert t.success and t.state.pos == (2, 2)
    assert t.reward == pytest.approx(4 * -0.01 + 1.5)


def test_failure_and_format_penalty():
    env = make_env()
    t = play(env, GRID, "D")
    assert not t.success and t.reward == pytest.approx(-0.01 - 1.0)
    for bad in (None, "", "go north", "D X"):
        t = play(env, GRID, bad)
        assert not t.format_ok and not t.success and t.reward == -2.0


def test_shaping_is_potential_based_and_telescopes():
    env = make_env(shaping=True)
    t = play(env, GRID, "D D R R")  # distances along the path 4, 3, 2, 1, 0: shaping d(start) - d(goal) = 4
    assert t.reward == pytest.approx(4 * -0.01 + 1.5 + 4)
    t = play(env, GRID, "D U D D R L R R")  # two back-and-forth pairs: their shaping cancels, their steps cost
    assert t.reward == pytest.approx(8 * -0.01 + 1.0 + 4)
    t = play(env, GRID, "D D")  # stops at distance 2: shaping 4 - 2, then the failure
    assert t.reward == pytest.approx(2 * -0.01 + 2 - 1.0)


def test_parse_moves():
    assert parse_moves("R r, up Down") == ["R", "R", "U", "D"]
    assert parse_moves("  ") is None
    assert parse_moves("R 2") is None


def _bfs_len(grid: Grid) -> int | None:
    """An independent shortest-path length: BFS from the start over a 0/1 matrix."""
    n = grid.size
    seen = {grid.start: 0}
    queue = deque([grid.start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == grid.goal:
            return seen[(r, c)]
        for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if 0 <= nr < n and 0 <= nc < n and (nr, nc) not in grid.blocked and (nr, nc) not in seen:
                seen[(nr, nc)] = seen[(r, c)] + 1
                queue.append((nr, nc))
    return None


@pytest.mark.parametrize("size,prob", [(4, 0.2), (6, 0.3), (10, 0.22)])
def test_oracle_matches_independent_bfs_and_solves(size, prob):
    rng = random.Random(size)
    env = make_env(size=size, block_prob=prob)
    for _ in range(100):
        grid = random_grid(size, prob, rng)
        path = shortest_path(grid)
        assert path is not None and len(path) == _bfs_len(grid)
        t = play(env, grid, env.oracle(env.initial_state(grid)))
        assert t.success and t.state.moves_made == len(path)


def test_unreachable_goal():
    grid = grid_from(["S#.", "##.", "..G"])
    env = make_env()
    assert shortest_path(grid) is None and _bfs_len(grid) is None
    assert env.oracle(env.initial_state(grid)) is None
    t = play(env, grid, "R D")
    assert not t.success and t.reward == pytest.approx(2 * -0.1 - 1.0)


def test_generated_tasks_are_solvable_and_deterministic():
    env = PlanPathEnv(PlanPathConfig(size=6), seed=3)
    for i in range(50):
        assert env.task("train", i) == env.task("train", i)
        assert shortest_path(env.task("eval", i)) is not None


def test_train_and_eval_seeds_are_disjoint():
    train = {task_seed("train", i, s) for s in range(5) for i in range(5000)}
    train |= {task_seed("warmstart", i, s) for s in range(5) for i in range(5000)}
    evals = {task_seed("eval", i, 0) for i in range(5000)}
    assert not train & evals
    assert max(train) < EVAL_SEED_BASE <= min(evals)


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="env.size"):
        make_env(size=1)


def test_episode_accepts_several_move_lists_and_only_the_last_fails():
    env = make_env(actions_per_episode=2)
    state = env.initial_state(GRID)
    first = env.step(state, "D")
    assert not first.done and first.reward == pytest.approx(-0.01)  # no failure penalty yet
    assert state.pos == (0, 0)  # stepping never mutates the state it was given
    second = env.step(first.state, "D R R")
    assert second.done and second.success and second.reward == pytest.approx(-0.03 + 1.5)  # 4 moves in all: optimal
    timeout = env.step(env.step(state, "D").state, "U")
    assert timeout.done and not timeout.success and timeout.reward == pytest.approx(-0.01 - 1.0)


def test_score_is_progress_towards_the_goal():
    env = make_env()
    state = env.initial_state(GRID)
    assert env.score(state) == 0.0
    assert env.score(env.step(state, "D R").state) == pytest.approx(0.5)
    assert env.score(env.step(state, "D D R R").state) == 1.0


def test_a_proposed_grid_is_a_task_when_the_program_can_solve_it_and_it_is_not_held_out():
    env = PlanPathEnv(PlanPathConfig(size=4, eval_size=20))
    grid = env.make_task(5)
    assert env.parse_task(env.write_task(grid)) == grid  # the proposer's notation reads back
    assert env.parse_task("S...\n....\n.#..\n...G") == Grid(4, frozenset({(2, 1)}), (0, 0), (3, 3))
    assert env.parse_task("S # . . / # . . . / . . . . / . . . G") is None  # the goal cannot be reached
    assert env.parse_task("S . . / . . . / . . G") is None  # not the family's size
    assert env.parse_task("S . . . / . . . . / . . S . / . . . G") is None  # two starts
    assert env.parse_task("S . . . / . x . . / . . . . / . . . G") is None  # not a cell
    assert env.parse_task(env.write_task(env.task("eval", 3))) is None  # a held-out grid is never trained on
