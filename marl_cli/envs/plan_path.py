"""Plan-Path: reach the goal on a grid with blocked cells (AT-GRPO paper, planning family).

The agent's action is a move list (``U D L R``) applied to the real grid one move at a time.
Rewards follow the paper: each move costs ``step_reward``, a move into a wall or off the grid costs
``invalid_reward`` and leaves the agent in place, reaching the goal pays ``goal_reward`` (plus
``optimal_bonus`` when the path is as short as the BFS oracle's), and ending elsewhere costs
``failure_reward``. With ``shaping`` on, each move also earns the potential-based term
``Φ(s') − Φ(s)`` with ``Φ(s) = −BFS distance to the goal``. The term is undiscounted because an
answer's rewards are summed undiscounted: it telescopes to ``Φ(end) − Φ(start)``, so no cycle of moves
earns anything and the shortest plan to the goal is the best answer. (The paper's γ = 0.99 pays
``(1 − γ)·d`` for every move made at distance ``d``, so padding a plan with back-and-forth moves out-earned
the shortest plan on almost every grid.)

With ``stop_at_goal`` (the paper's rule, the default) the episode ends the moment the goal is
reached and later moves are ignored. That rule lets a policy append extra moves for free, and RL on
a small model drifts that way; ``stop_at_goal=False`` instead plays every move, so a plan succeeds
only if it *ends* on the goal.
"""

from __future__ import annotations

import functools
import random
import re
from collections import deque
from dataclasses import dataclass, replace

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import PlanPathConfig
from marl_cli.envs.base import ENVS, Env, Transition

MOVES: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
_WORDS = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R"}
Cell = tuple[int, int]


@dataclass(frozen=True)
class Grid:
    """A square grid: ``blocked`` cells, a start and a goal."""

    size: int
    blocked: frozenset[Cell]
    start: Cell
    goal: Cell

    def free(self, cell: Cell) -> bool:
        r, c = cell
        return 0 <= r < self.size and 0 <= c < self.size and cell not in self.blocked

    def render(self) -> str:
        rows = []
        for r in range(self.size):
            row = []
            for c in range(self.size):
                cell = (r, c)
                row.append("S" if cell == self.start else "G" if cell == self.goal else
                           "#" if cell in self.blocked else ".")
            rows.append(" ".join(row))
        return "\n".join(rows)


def distances_to(grid: Grid, target: Cell) -> dict[Cell, int]:
    """BFS distance from every reachable free cell to ``target``."""
    dist = {target: 0}
    queue = deque([target])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if grid.free(nxt) and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def distance_info(dist: dict[Cell, int], pos: Cell) -> dict[str, float]:
    """``{"distance": d}``: the BFS distance from ``pos`` to the goal after a step (a progress estimator's diagnostic);
    nothing when the goal cannot be reached from there."""
    return {"distance": float(dist[pos])} if pos in dist else {}


def shortest_path(grid: Grid) -> list[str] | None:
    """The BFS oracle: a shortest move list from start to goal, or None when the goal is unreachable."""
    dist = distances_to(grid, grid.goal)
    if grid.start not in dist:
        return None
    path, cell = [], grid.start
    while cell != grid.goal:
        for move, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if dist.get(nxt) == dist[cell] - 1:
                path.append(move)
                cell = nxt
                break
    return path


def random_grid(size: int, block_prob: float, rng: random.Random) -> Grid:
    """A grid whose goal is reachable from its start (resampled until it is)."""
    cells = [(r, c) for r in range(size) for c in range(size)]
    while True:
        start, goal = rng.sample(cells, 2)
        blocked = frozenset(cell for cell in cells
                            if cell not in (start, goal) and rng.random() < block_prob)
        grid = Grid(size, blocked, start, goal)
        if shortest_path(grid) is not None:
            return grid


def parse_moves(text: str) -> list[str] | None:
    """``"R R d, left"`` → ``["R", "R", "D", "L"]``; None when empty or any token is not a move."""
    tokens = [t for t in re.split(r"[\s,;]+", text.strip()) if t]
    moves = []
    for token in tokens:
        word = token.upper()
        move = word if word in MOVES else _WORDS.get(word)
        if move is None:
            return None
        moves.append(move)
    return moves or None


@dataclass(frozen=True)
class PlanPathState:
    """Where the agent stands on the task's grid, and how the episode has gone so far."""

    grid: Grid
    pos: Cell
    moves_made: int = 0
    actions: int = 0
    done: bool = False
    success: bool = False


@ENVS.register("plan_path", schema=PlanPathConfig)
class PlanPathEnv(Env):
    """Grid path planning with a BFS oracle."""

    def __init__(self, cfg: PlanPathConfig, seed: int = 0, sandbox: object = None):
        super().__init__(cfg, seed, sandbox)
        if cfg.size < 2:
            raise ConfigError(f"env.size must be at least 2, got {cfg.size}")
        if not 0.0 <= cfg.block_prob < 0.9:
            raise ConfigError(f"env.block_prob must be in [0, 0.9), got {cfg.block_prob}")
        self.max_moves = cfg.max_moves or 2 * cfg.size * cfg.size

    def rules(self) -> str:
        return "Go from S to G. # is a wall. Moves: U D L R."

    def make_task(self, seed: int) -> Grid:
        return random_grid(self.cfg.size, self.cfg.block_prob, random.Random(seed))

    def initial_state(self, task: Grid) -> PlanPathState:
        return PlanPathState(grid=task, pos=task.start)

    def observe(self, state: PlanPathState) -> str:
        return replace(state.grid, start=state.pos).render()

    def oracle(self, state: PlanPathState) -> str | None:
        path = shortest_path(replace(state.grid, start=state.pos))
        return None if path is None else " ".join(path)

    writes_tasks = True

    def parse_task(self, text: str) -> Grid | None:
        """A grid of the family's size in its own notation (``S`` start, ``G`` goal, ``#`` wall, ``.`` free; rows on
        lines or separated by ``/``, cells by spaces or not at all): one start, one goal, the goal reachable from
        the start (the BFS program decides), and not one of the env's held-out grids; anything else is not a task."""
        rows = [row.replace(" ", "") for row in re.split(r"[\n/]+", text.strip()) if row.strip()]
        size = self.cfg.size
        if len(rows) != size or any(len(row) != size or set(row) - set("SG#.") for row in rows):
            return None
        cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
        starts = [cell for cell, ch in cells.items() if ch == "S"]
        goals = [cell for cell, ch in cells.items() if ch == "G"]
        if len(starts) != 1 or len(goals) != 1:
            return None
        grid = Grid(size, frozenset(cell for cell, ch in cells.items() if ch == "#"), starts[0], goals[0])
        if shortest_path(grid) is None or grid in self._held_out():
            return None
        return grid

    def write_task(self, task: Grid) -> str | None:
        """The grid as ``render`` draws it, rows separated by `` / `` (one line)."""
        return " / ".join(task.render().splitlines())

    @functools.cache  # noqa: B019 (one env per run; its held-out grids are fixed)
    def _held_out(self) -> frozenset[Grid]:
        """The grids of the env's evaluation split (``env.eval_size`` of them): no proposal may be one."""
        return frozenset(self.task("eval", i) for i in range(self.cfg.eval_size))

    def score(self, state: PlanPathState) -> float:
        dist = distances_to(state.grid, state.grid.goal)
        return max(0.0, 1.0 - dist[state.pos] / dist[state.grid.start])

    def step(self, state: PlanPathState, action: str | None) -> Transition:
        cfg = self.cfg
        actions = state.actions + 1
        last = actions >= cfg.actions_per_episode
        moves = None if action is None else parse_moves(action)
        grid, pos = state.grid, state.pos
        dist = distances_to(grid, grid.goal)
        if moves is None:
            return Transition(replace(state, actions=actions, done=last), cfg.format_penalty, done=last, success=False,
                              format_ok=False, info={"invalid_moves": 0, "moves": 0, **distance_info(dist, pos)})
        reward, invalid, made = 0.0, 0, state.moves_made
        for move in moves[: self.max_moves]:
            dr, dc = MOVES[move]
            nxt = (pos[0] + dr, pos[1] + dc)
            if not grid.free(nxt):
                reward += cfg.invalid_reward
                invalid += 1
                continue
            reward += cfg.step_reward
            if cfg.shaping:
                reward += dist[pos] - dist[nxt]
            pos, made = nxt, made + 1
            if cfg.stop_at_goal and pos == grid.goal:
                break
        success = pos == grid.goal
        if success:
            reward += cfg.goal_reward + (cfg.optimal_bonus if made == dist[grid.start] else 0.0)
        elif last:
            reward += cfg.failure_reward
        done = success or last
        new_state = PlanPathState(grid=grid, pos=pos, moves_made=made, actions=actions, done=done, success=success)
        return Transition(new_state, reward, done=done, success=success, format_ok=True,
                          info={"invalid_moves": invalid, "moves": len(moves), **distance_info(dist, pos)})
