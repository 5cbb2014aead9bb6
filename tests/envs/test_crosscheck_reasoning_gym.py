"""marl's own Sudoku and Plan-Path checkers against reasoning-gym's scorers, on the library's puzzles translated into
marl's states (its grid as marl's ``Puzzle``; its maze or shortest-path grid as marl's ``Grid``, a rectangle padded
to a square with blocked cells), each candidate answer judged by both.

Counts (reasoning-gym 0.1.25, each generator at seed 0; "disagree": one side solves, the other does not):

Sudoku (300 mini_sudoku 4x4 puzzles and 30 sudoku 9x9 ones, 15 candidates each: 4950 pairs). marl's solution
counter finds exactly one completion of every library puzzle, the library's stored solution. The checkers agree on
all 3300 candidates whose verdict is about content: the gold grid as the library writes it (both solve); another
puzzle's solution, two blanks swapped, a given changed, a grid of ones, the grid without its last row, empty,
garbage, the grid with chatter around it, a very long answer (neither solves). They disagree on all 1650 that state
the right grid in a layout the library does not pay 1.0 for: the gold grid with trailing spaces or a final newline
(the library strips them, then its length penalty scores 31/35 or 31/32 of 1), marl's own ``2413/3142/...`` rows
(0.0: no line holds 4 digits), the rows without spaces (0.9, "right digits, not the standard format") and ``r c v``
placements of every blank (0.0); marl solves all of them, by design (its prompt offers rows joined by / and
placements, and its workflow strips the answer). Content never splits them: both are right about the grid, and the
library's 1.0 also pays for its layout, as its question asks ("formatted as the puzzle").

Plan-Path on shortest_path (400 grids of 5-8 x 5-8 cells, 40% blocked). 147 have no path (answer "infeasible"):
marl cannot pose those (its generator resamples until the goal is reachable), so they are left out. On the 253
others marl's BFS distance equals the length of the library's answer, and marl's own shortest plan in the library's
words, a different path from the library's on 66 grids, scores 1.0 every time. Verdicts on one scale (marl: goal
reached by a plan of BFS length 1.0, by a longer one 0.5, else 0; the library: its score), 13 candidates a grid
(3271 pairs), marl's ``stop_at_goal=false`` (a plan must end on the goal: the toy table's rule): they agree on the
gold path, marl's plan in words, a detour (a step away and back: 0.5 both), a path that passes the goal and comes
back (0.5 both), the path cut short, empty, "infeasible" and garbage (2024 pairs), and on 239 of 253 other grids'
answers. They disagree on 968 pairs, always marl solving where the library scores 0:
- the gold path after a move into a wall or off the grid (235 grids with one beside the start): the library's 0 is
  right for its question (a path through open cells only); marl's env skips a blocked move at ``invalid_reward``
  (the AT-GRPO paper's rule), so the agent still arrives in BFS length, at a cost;
- 14 other grids' answers that hit a wall on the way and end on the goal all the same (12 in BFS length, 2 longer):
  the same wall rule;
- the gold path as ``R D L U`` letters (253), capitalised words (253), words joined by commas (213: the 40 one-move
  paths have no comma): marl reads them, the library's parser takes lower-case words split on spaces only. Format.
Under marl's default ``stop_at_goal=true`` (moves after the goal are ignored) marl also solves in BFS length what
the library scores 0.5: every path past the goal and back (253), the detours whose first step is the goal (12), and
9 more other grids' answers.

Maze (400 library mazes, 5-10 square, border walls, random symbols): marl's BFS distance on the translated grid equals
the library's answer on all 400; the library scores that distance 1.0 and the distances d - 1, d + 1 and 2d less;
marl's shortest plan reaches the goal in exactly that many moves.
"""

import random
from collections import Counter

import pytest
import reasoning_gym

from marl_cli.config.schema import PlanPathConfig, SudokuConfig
from marl_cli.envs.plan_path import Grid, PlanPathEnv, PlanPathState, distances_to, shortest_path
from marl_cli.envs.sudoku import Puzzle, SudokuEnv, SudokuState, count_solutions, render

WORDS = {"U": "up", "D": "down", "L": "left", "R": "right"}
STEP = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
BACK = {"up": "down", "down": "up", "left": "right", "right": "left"}


# --- Sudoku --------------------------------------------------------------------------------------------------


def as_puzzle(entry: dict) -> Puzzle:
    meta = entry["metadata"]
    givens, solution = (tuple(v for row in meta[key] for v in row) for key in ("puzzle", "solution"))
    return Puzzle(len(meta["solution"]), givens, solution)


def library_layout(cells: list[int] | tuple[int, ...], n: int) -> str:
    """A grid as the library writes one: digits separated by spaces, rows by newlines."""
    return "\n".join(" ".join(str(v) for v in cells[r * n:(r + 1) * n]) for r in range(n))


def sudoku_candidates(entry: dict, puzzle: Puzzle, other: str, rng: random.Random) -> dict[str, str]:
    """Answers to one puzzle by kind: content kinds first, then the right grid in layouts only marl reads."""
    gold, n = entry["answer"], puzzle.size
    blanks = [i for i, v in enumerate(puzzle.givens) if v == 0]
    swapped = list(puzzle.solution)
    a, b = next((a, b) for a in blanks for b in blanks if swapped[a] != swapped[b])
    swapped[a], swapped[b] = swapped[b], swapped[a]
    given = next(i for i, v in enumerate(puzzle.givens) if v)
    changed = list(puzzle.solution)
    changed[given] = changed[given] % n + 1
    return {
        "gold": gold, "gold_trailing_space": gold.replace("\n", " \n") + " ", "gold_newline": gold + "\n",
        "other_solution": other, "two_blanks_swapped": library_layout(swapped, n),
        "given_changed": library_layout(changed, n), "all_ones": library_layout([1] * n * n, n),
        "truncated": "\n".join(gold.split("\n")[:-1]),
        "empty": "", "garbage": "".join(rng.choice("1234 _\nxyz") for _ in range(40)),
        "chatter": f"The solution is:\n{gold}\nHope this helps!", "long": gold + " 1" * 3000,
        "marl_rows": render(puzzle.solution, n, sep="/"), "no_spaces": render(puzzle.solution, n),
        "placements": "; ".join(f"{i // n + 1} {i % n + 1} {puzzle.solution[i]}" for i in blanks),
    }


LAYOUT = ("gold_trailing_space", "gold_newline", "marl_rows", "no_spaces", "placements")
"""Kinds that state the right grid in a layout the library's scorer does not pay 1.0 for."""


def sudoku_verdicts(family: str, count: int) -> tuple[Counter, Counter]:
    """Per kind: pairs judged, and pairs where exactly one side solves (checking the library's solution is unique)."""
    library = reasoning_gym.create_dataset(family, seed=0, size=count)
    entries = [library[i] for i in range(count)]
    rng, judged, disagree = random.Random(family), Counter(), Counter()
    for k, entry in enumerate(entries):
        puzzle = as_puzzle(entry)
        assert count_solutions(puzzle.givens, puzzle.size) == 1
        env = SudokuEnv(SudokuConfig(size=puzzle.size, holes=1))
        state = SudokuState(puzzle, puzzle.givens)
        other = entries[(k + 1) % count]["answer"]
        for kind, answer in sudoku_candidates(entry, puzzle, other, rng).items():
            ours = env.step(state, answer).success
            theirs = library.score_answer(answer, entry) == 1.0
            judged[kind] += 1
            disagree[kind] += ours != theirs
            if ours != theirs:
                assert kind in LAYOUT and ours and not theirs, (kind, answer)
    return judged, disagree


@pytest.mark.parametrize("family, count", [("mini_sudoku", 300), ("sudoku", 30)])
def test_sudoku_checkers_agree_on_content_and_differ_only_on_layout(family, count):
    judged, disagree = sudoku_verdicts(family, count)
    assert sum(judged.values()) == 15 * count
    assert {kind: n for kind, n in disagree.items() if n} == {kind: count for kind in LAYOUT}


def test_the_library_scores_marls_own_puzzles_as_marl_does_in_its_format():
    library = reasoning_gym.create_dataset("mini_sudoku", seed=0, size=1)
    env = SudokuEnv(SudokuConfig(size=4, holes=8))
    for seed in range(100):
        puzzle = env.make_task(seed)
        rows = [list(puzzle.solution[r * 4:(r + 1) * 4]) for r in range(4)]
        entry = {"answer": "\n".join(" ".join(map(str, row)) for row in rows), "metadata": {"solution": rows}}
        assert library.score_answer(entry["answer"], entry) == 1.0
        assert env.step(env.initial_state(puzzle), entry["answer"]).success
        assert library.score_answer(render(puzzle.solution, 4), entry) == pytest.approx(0.9)  # rows without spaces
        assert library.score_answer(env.oracle(env.initial_state(puzzle)), entry) == 0.0  # marl's rows joined by /


# --- Plan-Path ------------------------------------------------------------------------------------------------


def as_grid(cells: list[list[str]] | list[str], blocked: str, start: str, goal: str) -> Grid:
    """A library grid (rows of cells) as marl's square ``Grid``: padding cells blocked."""
    rows, cols = len(cells), len(cells[0])
    size = max(rows, cols)
    where = {cells[r][c]: (r, c) for r in range(rows) for c in range(cols) if cells[r][c] in (start, goal)}
    walls = {(r, c) for r in range(size) for c in range(size) if r >= rows or c >= cols or cells[r][c] == blocked}
    return Grid(size, frozenset(walls), where[start], where[goal])


def first_open(grid: Grid, cell: tuple[int, int], want_open: bool) -> str | None:
    """A direction from ``cell`` into an open cell (or, ``want_open=False``, into a wall or off the grid)."""
    for word, (dr, dc) in STEP.items():
        if grid.free((cell[0] + dr, cell[1] + dc)) == want_open:
            return word
    return None


def path_candidates(gold: str, grid: Grid, others: list[str], rng: random.Random) -> dict[str, str]:
    ours = shortest_path(grid)
    out = {"gold": gold, "marl_plan_words": " ".join(WORDS[m] for m in ours), "cut_short": " ".join(gold.split()[:-1]),
           "other_answer": rng.choice(others), "empty": "", "infeasible": "infeasible",
           "garbage": "".join(rng.choice("updownleftright \n") for _ in range(30)),
           "marl_letters": " ".join(ours), "capitalised": gold.title(), "commas": gold.replace(" ", ", ")}
    away = first_open(grid, grid.start, True)
    if away:
        out["detour"] = f"{away} {BACK[away]} {gold}"
    past = first_open(grid, grid.goal, True)
    if past:
        out["past_the_goal"] = f"{gold} {past} {BACK[past]}"
    bump = first_open(grid, grid.start, False)
    if bump:
        out["wall_hit"] = f"{bump} {gold}"
    return out


def marl_verdict(env: PlanPathEnv, grid: Grid, answer: str) -> float:
    """marl's verdict on the library's scale: 1.0 goal reached by a plan of BFS length, 0.5 by a longer one, else 0."""
    step = env.step(PlanPathState(grid, grid.start), answer)
    if not step.success:
        return 0.0
    return 1.0 if step.state.moves_made == distances_to(grid, grid.goal)[grid.start] else 0.5


WALL_OR_FORMAT = {"wall_hit", "marl_letters", "capitalised", "commas", "other_answer"}
"""Kinds where marl's checker may solve what the library's does not (a blocked move is skipped; letters, capitals
and commas read): never the other way round, and never on any other kind."""


PASSING = {"past_the_goal", "detour", "other_answer"}
"""Kinds where, under ``stop_at_goal=true``, marl may stop on the goal in BFS length and ignore the moves after it."""


def plan_path_verdicts(stop_at_goal: bool) -> tuple[Counter, Counter, int]:
    """Per kind on the 400 shortest_path grids: pairs judged and pairs the two scales differ on; the grids without a
    path (checking marl's BFS distance is the length of the library's path on every other)."""
    library = reasoning_gym.create_dataset("shortest_path", seed=0, size=400)
    entries = [library[i] for i in range(400)]
    feasible = [e for e in entries if e["answer"] != "infeasible"]
    others = [e["answer"] for e in feasible]
    rng, judged, disagree = random.Random(0), Counter(), Counter()
    for entry in feasible:
        grid = as_grid(entry["metadata"]["matrix"], "X", "*", "#")
        assert distances_to(grid, grid.goal)[grid.start] == len(entry["answer"].split())
        env = PlanPathEnv(PlanPathConfig(size=grid.size, block_prob=0.0, stop_at_goal=stop_at_goal))
        for kind, answer in path_candidates(entry["answer"], grid, others, rng).items():
            ours, theirs = marl_verdict(env, grid, answer), library.score_answer(answer, entry)
            judged[kind] += 1
            if ours != theirs:
                disagree[kind] += 1
                assert (kind in WALL_OR_FORMAT and ours > theirs == 0.0) or (
                    stop_at_goal and kind in PASSING and (ours, theirs) == (1.0, 0.5)), (kind, answer)
    return judged, disagree, len(entries) - len(feasible)


def test_plan_path_and_shortest_path_agree_on_paths_and_differ_on_wall_hits_and_format():
    judged, disagree, infeasible = plan_path_verdicts(stop_at_goal=False)
    assert infeasible == 147 and judged["gold"] == 253 and sum(judged.values()) == 3271
    assert disagree == {"marl_letters": 253, "capitalised": 253, "commas": 213, "wall_hit": 235, "other_answer": 14}
    assert judged["wall_hit"] == 235


def test_under_the_papers_stop_at_goal_rule_passing_the_goal_is_also_a_shortest_plan_for_marl():
    disagree = plan_path_verdicts(stop_at_goal=True)[1]
    assert disagree == {"marl_letters": 253, "capitalised": 253, "commas": 213, "wall_hit": 235, "other_answer": 23,
                        "past_the_goal": 253, "detour": 12}


def test_marls_bfs_distance_is_the_librarys_maze_answer():
    library = reasoning_gym.create_dataset("maze", seed=0, size=400)
    for i in range(400):
        entry = library[i]
        meta = entry["metadata"]
        grid = as_grid(meta["grid"], meta["wall"], meta["start"], meta["goal"])
        distance = distances_to(grid, grid.goal)[grid.start]
        assert str(distance) == entry["answer"]
        assert library.score_answer(str(distance), entry) == 1.0
        assert all(library.score_answer(str(d), entry) < 1.0 for d in (distance - 1, distance + 1, 2 * distance))
        plan = shortest_path(grid)
        env = PlanPathEnv(PlanPathConfig(size=grid.size, block_prob=0.0, stop_at_goal=False))
        step = env.step(PlanPathState(grid, grid.start), " ".join(plan))
        assert step.success and step.state.moves_made == len(plan) == distance
