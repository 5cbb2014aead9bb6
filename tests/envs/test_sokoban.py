import pytest

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import SokobanConfig
from marl_cli.envs import build_env
from marl_cli.envs.sokoban import SokobanEnv, SokobanMap, solve

STEPS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def map_from(rows: list[str]) -> SokobanMap:
    """The map drawn in the observation's characters."""
    at = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    player = next(k for k, v in at.items() if v in "@+")
    cells = lambda chars: frozenset(k for k, v in at.items() if v in chars)  # noqa: E731
    return SokobanMap(len(rows), cells("#"), cells("O*+"), cells("X*"), player)


def text_move(rows: tuple[str, ...], direction: str) -> tuple[str, ...] | None:
    """An independent move on the drawn map itself, character by character; None when blocked."""
    grid = [list(row) for row in rows]
    r, c = next((r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch in "@+")
    dr, dc = STEPS[direction]
    ahead, beyond = grid[r + dr][c + dc], None
    if ahead == "#":
        return None
    if ahead in "X*":
        beyond = grid[r + 2 * dr][c + 2 * dc]
        if beyond not in ".O":
            return None
        grid[r + 2 * dr][c + 2 * dc] = "*" if beyond == "O" else "X"
    grid[r + dr][c + dc] = "+" if ahead in "O*" else "@"
    grid[r][c] = "O" if grid[r][c] == "+" else "."
    return tuple("".join(row) for row in grid)


def bfs_length(rows: list[str]) -> int | None:
    """An independent solver: breadth-first over whole drawn maps until no box is off a goal."""
    frontier, seen, depth = [tuple(rows)], {tuple(rows)}, 0
    while frontier:
        if any(not any("X" in row for row in state) for state in frontier):
            return depth
        following = []
        for state in frontier:
            for direction in STEPS:
                nxt = text_move(state, direction)
                if nxt is not None and nxt not in seen:
                    seen.add(nxt)
                    following.append(nxt)
        frontier, depth = following, depth + 1
    return None


def make_env(**kw) -> SokobanEnv:
    return SokobanEnv(SokobanConfig(**kw))


def play(env: SokobanEnv, rows: list[str], action: str | None):
    return env.step(env.initial_state(map_from(rows)), action)


CORRIDOR = ["######",
            "#@X.O#",
            "#....#",
            "#....#",
            "#....#",
            "######"]  # R R solves it
TWO = ["######",
       "#@*..#",
       "#....#",
       "#.X.O#",
       "#....#",
       "######"]  # one box on a goal, one off
PINNED = ["######",
          "#X...#",
          "#..@.#",
          "#...O#",
          "#....#",
          "######"]  # the box is stuck in a corner: unsolvable
HAND_MAPS = [CORRIDOR, TWO, PINNED,
             ["######", "#.O..#", "#.X#.#", "#.@..#", "#....#", "######"],
             ["######", "#O..##", "#.XX.#", "#.@..#", "##..O#", "######"],
             ["#######", "#O....#", "#.###.#", "#.#@X.#", "#.....#", "#.....#", "#######"]]


@pytest.mark.parametrize("rows", HAND_MAPS)
def test_solver_agrees_with_independent_bfs_on_hand_maps(rows):
    task = map_from(rows)
    path = solve(task, task.player, task.boxes)
    expected = bfs_length(rows)
    assert (path is None) == (expected is None)
    if path is not None:
        env = make_env(size=task.size)
        assert len(path) == expected and env.step(env.initial_state(task), " ".join(path)).success


@pytest.mark.parametrize("boxes,walls,seeds", [(1, 2, range(40)), (2, 2, range(25)), (1, 4, range(15))])
def test_generated_maps_are_solvable_unsolved_and_the_oracle_is_optimal(boxes, walls, seeds):
    env = make_env(boxes=boxes, walls=walls)
    for seed in seeds:
        task = env.make_task(seed)
        assert task == env.make_task(seed)  # deterministic from the seed
        state = env.initial_state(task)
        rows = env.observe(state).splitlines()
        assert map_from(rows) == task  # the observation draws the whole map
        assert all(row[0] == row[-1] == "#" for row in rows) and set(rows[0]) == set(rows[-1]) == {"#"}
        assert sum(row[1:-1].count("#") for row in rows[1:-1]) == walls
        assert len(task.boxes) == len(task.goals) == boxes and task.boxes != task.goals
        assert env.score(state) < 1.0
        oracle = env.oracle(state)
        assert oracle is not None and len(oracle.split()) == bfs_length(rows)
        t = env.step(state, oracle)
        assert t.success and t.done and env.score(t.state) == 1.0 and t.info["invalid_moves"] == 0


def test_push_and_win_end_the_episode():
    env = make_env()
    t = play(env, CORRIDOR, "R R L L")  # the win comes after two moves; the rest is ignored
    assert t.success and t.done and t.format_ok
    assert t.reward == pytest.approx(2 * -0.01 + 1.0 + 10.0)
    assert t.state.moves_made == 2 and t.state.player == (1, 3)
    assert env.observe(t.state).splitlines()[1] == "#..@*#"


def test_walls_and_blocked_pushes_are_invalid():
    env = make_env(actions_per_episode=2)
    t = play(env, CORRIDOR, "U L")  # walls above and to the left
    assert t.info["invalid_moves"] == 2 and t.state.player == (1, 1) and t.reward == pytest.approx(-0.1)
    t = play(env, ["######", "#.@X##", "#....#", "#..O.#", "#....#", "######"], "R")  # box into a wall
    assert t.state.player == (1, 2) and t.state.boxes == {(1, 3)} and t.reward == pytest.approx(-0.05)
    t = play(env, ["######", "#@XX.#", "#...O#", "#...O#", "#....#", "######"], "R")  # box into a box
    assert t.state.player == (1, 1) and t.state.boxes == {(1, 2), (1, 3)} and t.reward == pytest.approx(-0.05)
    t = play(env, CORRIDOR, "D R")  # walking is not pushing
    assert t.state.player == (2, 2) and t.state.boxes == {(1, 2)} and t.reward == pytest.approx(-0.02)


def test_box_on_and_off_goal_rewards_and_score():
    env = make_env(actions_per_episode=3)
    state = env.initial_state(map_from(TWO))
    assert env.score(state) == 0.5
    off = env.step(state, "R")  # pushes the box off its goal
    assert off.reward == pytest.approx(-0.01 - 1.0) and env.score(off.state) == 0.0
    assert env.observe(off.state).splitlines()[1] == "#.+X.#"  # the player now stands on the goal
    assert state.boxes == {(1, 2), (3, 2)} and state.player == (1, 1)  # stepping never mutates its state
    on = env.step(off.state, "L D D R R")  # round to the left of the lower box, then push it onto its goal
    assert on.reward == pytest.approx(5 * -0.01 + 1.0) and env.score(on.state) == 0.5 and not on.done
    goal_to_goal = play(make_env(), ["######", "#@*O.#", "#....#", "#.X..#", "#....#", "######"], "R")
    assert goal_to_goal.reward == pytest.approx(-0.01 - 5.0)  # still one box on a goal; the only action fails


def test_failure_at_the_last_action_or_move():
    env = make_env(actions_per_episode=2)
    state = env.initial_state(map_from(CORRIDOR))
    first = env.step(state, "R")
    assert not first.done and first.reward == pytest.approx(-0.01)  # no failure penalty yet
    second = env.step(first.state, "D")
    assert second.done and not second.success and second.reward == pytest.approx(-0.01 - 5.0)
    limited = make_env(actions_per_episode=5, max_moves=3)
    t = limited.step(limited.initial_state(map_from(CORRIDOR)), "D D L R R")  # only the first 3 moves count
    assert t.done and not t.success and t.state.moves_made == 3 and t.state.player == (3, 1)
    assert t.reward == pytest.approx(2 * -0.01 - 0.05 - 5.0)


def test_format_failure_counts_as_an_action():
    env = make_env(actions_per_episode=2)
    for bad in (None, "", "push it", "RR", "R 2"):
        t = play(env, CORRIDOR, bad)
        assert not t.format_ok and not t.done and t.reward == -6.0 and t.state.actions == 1
    assert env.step(play(env, CORRIDOR, None).state, "left, Right r").success  # moves parse as in Plan-Path


def test_oracle_is_none_when_unsolvable_or_solved():
    env = make_env()
    assert env.oracle(env.initial_state(map_from(PINNED))) is None
    assert env.oracle(play(env, CORRIDOR, "R R").state) is None
    assert env.oracle(env.initial_state(map_from(CORRIDOR))) == "R R"


def test_bad_config_is_rejected():
    for kw in ({"size": 4}, {"boxes": 0}, {"boxes": 3}, {"walls": 5}, {"max_moves": 0}, {"actions_per_episode": 0},
               {"box_off_goal_reward": -0.5}, {"box_on_goal_reward": 2.0}):
        with pytest.raises(ConfigError):
            make_env(**kw)


def test_registered():
    assert isinstance(build_env(SokobanConfig(), seed=0), SokobanEnv)
