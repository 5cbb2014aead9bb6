"""Sudoku: fill the blanks of a grid with a unique solution (AT-GRPO paper, planning family: 4×4).

A ``size``×``size`` grid (4 or 9, boxes ``sqrt(size)`` on a side) must end with every digit
``1..size`` once in each row, column and box. Puzzles are generated from the seed: a random full
grid, then ``holes`` cells blanked one at a time in random order, each only if the puzzle keeps a
unique solution (a solution counter that stops at two).

An action is either the full grid, ``size`` rows of digits separated by ``/`` or newlines
(``1234/3412/2143/4321``), or placements ``r c v`` (1-based row, column, value) separated by ``;``
(``1 2 3; 4 4 1``). The placed digits replace the grid's; an action that changes a given
(pre-filled) cell is rejected and leaves the grid as it was. Rewards follow the paper: reaching the
solution pays ``solved_reward`` and ends the episode; a grid that breaks a row, column or box rule,
or a rejected action, costs ``invalid_reward``; any other well-formed action earns ``step_reward``;
an answer that is neither form costs ``format_penalty``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cache
from itertools import islice
from math import isqrt

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import SudokuConfig
from marl_cli.envs.base import ENVS, Env, Transition

MAX_HOLES = {4: 12, 9: 54}
"""The most blanks per size; near them a removal order may fall short, and the puzzle is resampled."""

Cells = tuple[int, ...]
"""A grid, row by row; 0 is a blank."""


@cache
def units(size: int) -> tuple[tuple[int, ...], ...]:
    """The cell indices of every row, column and box of a ``size``×``size`` grid."""
    box = isqrt(size)
    rows = [tuple(r * size + c for c in range(size)) for r in range(size)]
    cols = [tuple(r * size + c for r in range(size)) for c in range(size)]
    boxes = [tuple((br + r) * size + bc + c for r in range(box) for c in range(box))
             for br in range(0, size, box) for bc in range(0, size, box)]
    return tuple(rows + cols + boxes)


def is_valid(cells: Cells, size: int) -> bool:
    """No digit repeats within a row, column or box (blanks aside)."""
    for unit in units(size):
        digits = [cells[i] for i in unit if cells[i]]
        if len(digits) != len(set(digits)):
            return False
    return True


def solutions(cells: Sequence[int], size: int, rng: random.Random | None = None) -> Iterator[Cells]:
    """Every completion of ``cells`` (backtracking, most constrained blank first; random digit order with ``rng``)."""
    box = isqrt(size)
    full = (1 << (size + 1)) - 2  # bits 1..size
    used = [0] * (3 * size)  # digit bit masks: rows, then columns, then boxes
    grid = list(cells)
    blanks = []
    for i, v in enumerate(grid):
        r, c = divmod(i, size)
        keys = (r, size + c, 2 * size + (r // box) * box + c // box)
        if v == 0:
            blanks.append((i, keys))
        elif any(used[k] & 1 << v for k in keys):
            return
        else:
            for k in keys:
                used[k] |= 1 << v

    def search() -> Iterator[Cells]:
        if not blanks:
            yield tuple(grid)
            return
        best, best_free, best_count = 0, 0, size + 1
        for j, (_, (a, b, c)) in enumerate(blanks):
            free = full & ~(used[a] | used[b] | used[c])
            if free.bit_count() < best_count:
                best, best_free, best_count = j, free, free.bit_count()
                if best_count <= 1:
                    break
        blanks[best], blanks[-1] = blanks[-1], blanks[best]
        i, keys = blanks.pop()
        digits = [v for v in range(1, size + 1) if best_free & 1 << v]
        if rng is not None:
            rng.shuffle(digits)
        for v in digits:
            grid[i] = v
            for k in keys:
                used[k] |= 1 << v
            yield from search()
            for k in keys:
                used[k] ^= 1 << v
        grid[i] = 0
        blanks.append((i, keys))
        blanks[best], blanks[-1] = blanks[-1], blanks[best]

    yield from search()


def count_solutions(cells: Sequence[int], size: int, limit: int = 2) -> int:
    """How many solutions ``cells`` has, counting no further than ``limit``."""
    return sum(1 for _ in islice(solutions(cells, size), limit))


@dataclass(frozen=True)
class Puzzle:
    """The given cells (0 where blank) and the unique solution."""

    size: int
    givens: Cells
    solution: Cells


def make_puzzle(size: int, holes: int, rng: random.Random) -> Puzzle:
    """A puzzle with ``holes`` blanks and a unique solution (resampled until a removal order gets there)."""
    while True:
        solution = next(solutions([0] * size * size, size, rng))
        cells = list(solution)
        blanked = 0
        for i in rng.sample(range(size * size), size * size):
            cells[i] = 0
            if count_solutions(cells, size) == 1:
                blanked += 1
                if blanked == holes:
                    return Puzzle(size, tuple(cells), solution)
            else:
                cells[i] = solution[i]


def render(cells: Cells, size: int, sep: str = "\n") -> str:
    """Rows of digits (``.`` for a blank) joined by ``sep``."""
    return sep.join("".join(str(v) if v else "." for v in cells[r * size:(r + 1) * size]) for r in range(size))


def parse_answer(text: str, size: int) -> dict[int, int] | None:
    """Cell index → digit from a full grid (``1234/3412/...``) or placements (``r c v; ...``); None if neither."""
    rows = [re.sub(r"\s+", "", row) for row in re.split(r"[/\n]", text.strip())]
    digit = f"[1-{size}]"
    if len(rows) == size and all(re.fullmatch(f"{digit}{{{size}}}", row) for row in rows):
        return {i: int(ch) for i, ch in enumerate("".join(rows))}
    parts = [part for part in re.split(r"[;\n]", text) if part.strip()]
    placements = {}
    for part in parts:
        match = re.fullmatch(rf"\s*({digit})[\s,]+({digit})[\s,]+({digit})\s*", part)
        if match is None:
            return None
        r, c, v = (int(g) for g in match.groups())
        placements[(r - 1) * size + c - 1] = v
    return placements or None


@dataclass(frozen=True)
class SudokuState:
    """The current grid of the task's puzzle, and how the episode has gone so far."""

    puzzle: Puzzle
    cells: Cells
    actions: int = 0
    done: bool = False
    success: bool = False


@ENVS.register("sudoku", schema=SudokuConfig)
class SudokuEnv(Env):
    """Sudoku with unique solutions; the oracle answers with the solution grid."""

    def __init__(self, cfg: SudokuConfig, seed: int = 0, sandbox: object = None):
        super().__init__(cfg, seed, sandbox)
        if cfg.size not in MAX_HOLES:
            raise ConfigError(f"env.size must be one of {sorted(MAX_HOLES)}, got {cfg.size}")
        if not 1 <= cfg.holes <= MAX_HOLES[cfg.size]:
            raise ConfigError(f"env.holes must be in [1, {MAX_HOLES[cfg.size]}] for size {cfg.size}, got {cfg.holes}")

    def rules(self) -> str:
        n, box = self.cfg.size, isqrt(self.cfg.size)
        return (f"Fill each . so every row, column and {box}x{box} box has 1-{n} once. "
                "Answer the grid as rows joined by /, or r c v placements joined by ;.")

    def make_task(self, seed: int) -> Puzzle:
        return make_puzzle(self.cfg.size, self.cfg.holes, random.Random(seed))

    def initial_state(self, task: Puzzle) -> SudokuState:
        return SudokuState(puzzle=task, cells=task.givens)

    def observe(self, state: SudokuState) -> str:
        return render(state.cells, state.puzzle.size)

    def oracle(self, state: SudokuState) -> str:
        return render(state.puzzle.solution, state.puzzle.size, sep="/")

    def score(self, state: SudokuState) -> float:
        puzzle = state.puzzle
        blanks = [i for i, v in enumerate(puzzle.givens) if v == 0]
        return sum(state.cells[i] == puzzle.solution[i] for i in blanks) / len(blanks)

    def step(self, state: SudokuState, action: str | None) -> Transition:
        cfg = self.cfg
        actions = state.actions + 1
        last = actions >= cfg.actions_per_episode
        puzzle = state.puzzle
        placements = None if action is None else parse_answer(action, puzzle.size)
        if placements is None:
            return Transition(replace(state, actions=actions, done=last), cfg.format_penalty, done=last, success=False,
                              format_ok=False, info={"invalid": 0, "givens_changed": 0})
        changed = sum(1 for i, v in placements.items() if puzzle.givens[i] not in (0, v))
        cells = state.cells if changed else tuple(placements.get(i, v) for i, v in enumerate(state.cells))
        success = not changed and cells == puzzle.solution
        invalid = changed > 0 or not is_valid(cells, puzzle.size)
        reward = cfg.solved_reward if success else cfg.invalid_reward if invalid else cfg.step_reward
        done = success or last
        new_state = SudokuState(puzzle=puzzle, cells=cells, actions=actions, done=done, success=success)
        return Transition(new_state, reward, done=done, success=success, format_ok=True,
                          info={"invalid": int(invalid), "givens_changed": changed})
