"""Sokoban: push every box onto a goal (AT-GRPO paper, planning family: 6×6, up to 200 steps).

A ``size``×``size`` map has walls on its border and ``walls`` random interior walls, ``boxes`` boxes
and as many goals. Maps are generated from the seed by reverse play: boxes start on the goals and
random walks of the player pull them away; of a few walks the one with the longest BFS solution is
kept, and a layout that every walk leaves solved is resampled. The observation draws ``#`` wall,
``.`` floor, ``O`` goal, ``X`` box, ``*`` box on a goal, ``@`` player and ``+`` player on a goal,
one row per line.

The agent's action is a move list (``U D L R``, parsed as in Plan-Path) applied one move at a time;
a move pushes the box in front of the player when the cell beyond it is free. Rewards follow the
paper: each move carried out costs ``step_reward``; walking into a wall or pushing a box into a
wall or box costs ``invalid_reward`` and leaves everything in place; a box pushed onto a goal pays
``box_on_goal_reward`` and one pushed off a goal costs ``box_off_goal_reward``. That pair is shaping
with the potential ``box_on_goal_reward × boxes on goals``, so it must telescope: the paper's −0.5 for a
push off (against +1 on) paid +0.5 for every push off and back on, and padded solutions out-earned the
shortest one; the default is −1 and anything above ``−box_on_goal_reward`` is refused. Every box on a goal
pays ``win_reward`` and ends the episode at once (later moves are ignored). An episode scores at
most ``max_moves`` moves; when its last action, or its last allowed move, leaves the puzzle
unsolved, the episode ends and that action also costs ``failure_reward``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import SokobanConfig
from marl_cli.envs.base import ENVS, Env, Transition
from marl_cli.envs.plan_path import MOVES, parse_moves

SEARCH_CAP = 200_000
"""The most (player, boxes) states the oracle's BFS visits before it gives up."""

REVERSE_WALKS = 4
"""Reverse walks tried per generated layout; the map with the longest shortest solution is kept."""

Cell = tuple[int, int]
Boxes = frozenset[Cell]


@dataclass(frozen=True)
class SokobanMap:
    """The walls (border included), the goals, and where the boxes and the player start."""

    size: int
    walls: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: Boxes
    player: Cell

    def render(self, player: Cell, boxes: Boxes) -> str:
        return "\n".join("".join(self.char((r, c), player, boxes) for c in range(self.size)) for r in range(self.size))

    def char(self, cell: Cell, player: Cell, boxes: Boxes) -> str:
        """The observation's character for ``cell``."""
        if cell in self.walls:
            return "#"
        goal = cell in self.goals
        if cell == player:
            return "+" if goal else "@"
        if cell in boxes:
            return "*" if goal else "X"
        return "O" if goal else "."


def move(walls: frozenset[Cell], player: Cell, boxes: Boxes, direction: str) -> tuple[Cell, Boxes] | None:
    """The player and boxes after one move (pushing a box in front), or None when the move is blocked."""
    dr, dc = MOVES[direction]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in walls:
        return None
    if nxt not in boxes:
        return nxt, boxes
    beyond = (nxt[0] + dr, nxt[1] + dc)
    if beyond in walls or beyond in boxes:
        return None
    return nxt, boxes - {nxt} | {beyond}


def solve(task: SokobanMap, player: Cell, boxes: Boxes) -> list[str] | None:
    """A shortest move list that puts every box on a goal (BFS over player and boxes), or None.

    None also when the search visits ``SEARCH_CAP`` states without a solution.
    """
    start = (player, boxes)
    parent: dict[tuple[Cell, Boxes], tuple[tuple[Cell, Boxes], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if state[1] == task.goals:
            path = []
            while (link := parent[state]) is not None:
                state, step = link
                path.append(step)
            return path[::-1]
        for direction in MOVES:
            nxt = move(task.walls, *state, direction)
            if nxt is not None and nxt not in parent:
                if len(parent) >= SEARCH_CAP:
                    return None
                parent[nxt] = (state, direction)
                queue.append(nxt)
    return None


def reverse_walk(solved: SokobanMap, steps: int, rng: random.Random) -> SokobanMap:
    """The map left by ``steps`` random player moves on ``solved``, pulling each box the player walks away from.

    A pull is the reverse of a push, so the walk played backwards solves the map.
    """
    walls, player, boxes = solved.walls, solved.player, solved.boxes
    for _ in range(steps):
        dr, dc = MOVES[rng.choice("UDLR")]
        nxt, behind = (player[0] + dr, player[1] + dc), (player[0] - dr, player[1] - dc)
        if nxt in walls or nxt in boxes:
            continue
        if behind in boxes:
            boxes = boxes - {behind} | {player}
        player = nxt
    return replace(solved, boxes=boxes, player=player)


def random_map(size: int, n_boxes: int, n_walls: int, rng: random.Random) -> SokobanMap:
    """A solvable, unsolved map: the reverse walk with the longest solution of ``REVERSE_WALKS`` from a solved map.

    The walls, goals and player are resampled when no walk leaves the map unsolved.
    """
    border = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
    interior = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    while True:
        walls = frozenset(border.union(rng.sample(interior, n_walls)))
        *goals, player = rng.sample([cell for cell in interior if cell not in walls], n_boxes + 1)
        solved = SokobanMap(size, walls, frozenset(goals), frozenset(goals), player)
        best, best_length = None, 0
        for _ in range(REVERSE_WALKS):
            task = reverse_walk(solved, 4 * size * size, rng)
            path = solve(task, task.player, task.boxes)
            if path is not None and len(path) > best_length:
                best, best_length = task, len(path)
        if best is not None:
            return best


@dataclass(frozen=True)
class SokobanState:
    """Where the player and the boxes stand on the task's map, and how the episode has gone so far."""

    task: SokobanMap
    player: Cell
    boxes: Boxes
    moves_made: int = 0
    actions: int = 0
    done: bool = False
    success: bool = False


def check_settings(env: SokobanConfig) -> None:
    """The rules across ``env``'s keys: checked with the whole config before anything is built, and again by
    the env itself (built from a config no check has seen: tests, scripts)."""
    if not 5 <= env.size <= 10:
        raise ConfigError(f"env.size must be in [5, 10], got {env.size}")
    if env.boxes not in (1, 2):
        raise ConfigError(f"env.boxes must be 1 or 2, got {env.boxes}")
    max_walls = (env.size - 2) ** 2 // 4
    if not 0 <= env.walls <= max_walls:
        raise ConfigError(f"env.walls must be in [0, {max_walls}] for size {env.size}, got {env.walls}")
    if env.max_moves < 1:
        raise ConfigError(f"env.max_moves must be at least 1, got {env.max_moves}")
    if env.box_off_goal_reward > -env.box_on_goal_reward:
        raise ConfigError(f"env.box_off_goal_reward={env.box_off_goal_reward} must be at most "
                          f"-env.box_on_goal_reward={-env.box_on_goal_reward}: otherwise pushing a box off a goal "
                          "and back on earns reward, and padding beats the shortest solution")


@ENVS.register("sokoban", schema=SokobanConfig, check=lambda cfg: check_settings(cfg.env))
class SokobanEnv(Env):
    """Sokoban with maps made by reverse play and a BFS oracle."""

    def __init__(self, cfg: SokobanConfig, seed: int = 0, sandbox: object = None):
        super().__init__(cfg, seed, sandbox)
        check_settings(cfg)

    def rules(self) -> str:
        return "Push every box X onto a goal O. @ is you, # a wall, * a box on a goal. Moves: U D L R."

    def make_task(self, seed: int) -> SokobanMap:
        return random_map(self.cfg.size, self.cfg.boxes, self.cfg.walls, random.Random(seed))

    def initial_state(self, task: SokobanMap) -> SokobanState:
        return SokobanState(task=task, player=task.player, boxes=task.boxes)

    def observe(self, state: SokobanState) -> str:
        return state.task.render(state.player, state.boxes)

    def oracle(self, state: SokobanState) -> str | None:
        path = solve(state.task, state.player, state.boxes)
        return " ".join(path) if path else None

    def score(self, state: SokobanState) -> float:
        return len(state.boxes & state.task.goals) / len(state.task.goals)

    def step(self, state: SokobanState, action: str | None) -> Transition:
        cfg = self.cfg
        actions = state.actions + 1
        last = actions >= cfg.actions_per_episode
        moves = None if action is None else parse_moves(action)
        if moves is None:
            return Transition(replace(state, actions=actions, done=last), cfg.format_penalty, done=last, success=False,
                              format_ok=False, info={"invalid_moves": 0, "moves": 0})
        task, player, boxes = state.task, state.player, state.boxes
        reward, invalid, made = 0.0, 0, state.moves_made
        for direction in moves[: cfg.max_moves - made]:
            made += 1
            result = move(task.walls, player, boxes, direction)
            if result is None:
                reward += cfg.invalid_reward
                invalid += 1
                continue
            on_goal = len(result[1] & task.goals) - len(boxes & task.goals)
            reward += cfg.step_reward + (cfg.box_on_goal_reward if on_goal > 0 else
                                         cfg.box_off_goal_reward if on_goal < 0 else 0.0)
            player, boxes = result
            if boxes == task.goals:
                break
        success = boxes == task.goals
        out_of_budget = last or made >= cfg.max_moves
        if success:
            reward += cfg.win_reward
        elif out_of_budget:
            reward += cfg.failure_reward
        done = success or out_of_budget
        new_state = SokobanState(task=task, player=player, boxes=boxes, moves_made=made, actions=actions, done=done,
                                 success=success)
        return Transition(new_state, reward, done=done, success=success, format_ok=True,
                          info={"invalid_moves": invalid, "moves": len(moves)})
