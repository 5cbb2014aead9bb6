"""Procedural reasoning tasks from reasoning-gym as an environment: any of the library's datasets by name and
parameters (``env=reasoning_gym env.dataset=maze +env.params.min_dist=3``), or a weighted mixture of several
through the library's composite dataset (``env.datasets``), with the library's questions, gold answers and scorers.

A task is the library's entry (question, answer, metadata) for a seed: the dataset built with that seed and size 1,
its entry 0 (most generators draw entry ``i`` from ``Random(seed + i)``), Python's global generator seeded by it
too and restored after. Splits never share a question, however often a generator repeats one: a question is on the
evaluation side exactly when a hash of its text says so (``math_data.held_out``, one in eight); a task seed whose
question lies on the other side (or that the library's generator gives up on) moves on to the next seed of a chain
drawn from it until one lies right, so evaluation tasks only take evaluation-side questions and training (and
warm-start) tasks only the others. An evaluation task thus costs about eight generations (tasks are cached, so an
evaluation's tasks are generated once per run); a dataset whose generator is slow (countdown, sudoku: 65-95 ms a
puzzle) pays that once.

An answer (the text after the answer marker) scores what the library's own ``score_answer(answer, entry)`` gives,
a float in [0, 1]: that is the step's reward and the state's score (an agent's reward is ``alpha * team + local``,
as for every env: twice the score at the default alpha 1), and 1.0 is a success that ends the episode. No
answer at all (or one the library's scorer raises on) is a format failure paying ``env.format_penalty``. The oracle
is the entry's gold answer where the library scores it 1.0 (some datasets have no single gold answer: no warm start).

reasoning-gym is an optional dependency (``pip install 'marl[reasoning_gym]'``), imported only when tasks are built.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import random
import typing
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

from omegaconf import MISSING

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import EnvConfig, bounded
from marl_cli.envs.base import ENVS, EVAL_SEED_BASE, AnswerState, Env, Transition, answer_step, own_random, plain
from marl_cli.envs.math_data import held_out

INSTALL = "pip install 'marl[reasoning_gym]'"
RESERVED = ("seed", "size")
"""Dataset config fields marl sets itself: the seed from each task, the size 1."""
MAX_DRAWS = 256
"""Seeds tried for one task before its split is declared unreachable (an eval-side question turns up one draw in 8)."""
MAX_FAILURES = 3
"""Seeds of one task the library's generator may give up on (a rare maze) before its parameters are refused."""
SEED_SPAN = 2 ** 31
"""Chained seeds lie in [0, SEED_SPAN): every generator takes them (some hand them to numpy)."""


@dataclass
class ReasoningGymPart:
    """One dataset of a mixture (``env.datasets``)."""

    name: str = MISSING  # a reasoning-gym dataset
    weight: float = bounded(1.0, gt=0.0)  # its share of the tasks (the library's composite weights)
    params: dict[str, Any] = field(default_factory=dict)  # its config fields, as env.params


@dataclass
class ReasoningGymConfig(EnvConfig):
    """A reasoning-gym dataset (``reasoning_gym.factory.DATASETS``), or a mixture of them."""

    name: str = "reasoning_gym"
    dataset: str = "basic_arithmetic"  # the library's dataset name (maze, mini_sudoku, basic_arithmetic, ...)
    params: dict[str, Any] = field(default_factory=dict)  # its config fields, e.g. {min_dist: 3} (not seed, size)
    # a mixture, e.g. [{name: maze, weight: 2}, {name: gcd, params: {max_value: 99}}]: each task's dataset drawn by
    # weight (the library's composite dataset); env.dataset and env.params are then unused
    datasets: list[ReasoningGymPart] = field(default_factory=list)
    rules: str = "Answer the question."  # the line shown before each question
    format_penalty: float = bounded(-1.0, le=0.0)  # no answer after the marker (the library scores answers 0 to 1)


@dataclass(frozen=True)
class Spec:
    """What generates the tasks: (dataset, weight, its params as sorted JSON) per part; one part without a mixture."""

    parts: tuple[tuple[str, float, str], ...]
    mixture: bool = False


@dataclass(frozen=True)
class ReasoningTask:
    """A library entry and the seed the library built it from (``dataset(seed=seed, size=1)[0]``)."""

    seed: int
    entry: dict[str, Any] = field(hash=False)  # the library's dict (a task hashes by its seed)

    @property
    def question(self) -> str:
        return self.entry["question"]

    @property
    def dataset(self) -> str:
        return self.entry.get("metadata", {}).get("source_dataset", "")


def library() -> Any:
    """The reasoning-gym package; a one-line ConfigError when it is not installed."""
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(f"env=reasoning_gym needs reasoning-gym: {INSTALL}") from None
    return reasoning_gym


def as_typed(hint: Any, value: Any) -> Any:
    """``value`` with every string the field type ``hint`` wants as an enum member turned into that member (by value,
    else by name; a ValueError naming the choices otherwise); other values as they are."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum) and isinstance(value, str):
        members = {str(m.value): m for m in hint} | {m.name.lower(): m for m in hint}
        member = members.get(value, members.get(value.lower()))
        if member is None:
            raise ValueError(f"{value!r} is not a {hint.__name__}; choose from {', '.join(str(m.value) for m in hint)}")
        return member
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (list, tuple) and args and isinstance(value, list):
        return [as_typed(args[0], v) for v in value]
    return value


@cache
def field_types(name: str) -> dict[str, Any]:
    """The field types of dataset ``name``'s config class, resolved once (every task's generation needs them)."""
    from reasoning_gym.factory import DATASETS

    try:
        return typing.get_type_hints(DATASETS[name][1])
    except Exception:  # an annotation that does not resolve: the params go as written
        return {}


def typed(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` of dataset ``name`` as its config class takes them: YAML writes an enum field (aiw's
    ``task_types: [siblings]``) as strings, the library wants its enum members."""
    hints = field_types(name)
    return {key: as_typed(hints.get(key), value) for key, value in params.items()}


def check_part(name: str, params: dict[str, Any], where: str) -> None:
    """The dataset ``name`` exists and its config takes ``params`` (its fields, its ``validate``); ``where`` is the
    config node naming them (``env``, ``env.datasets[1]``)."""
    from reasoning_gym.factory import DATASETS

    names = sorted(n for n in DATASETS if n != "composite")
    if name not in names:
        near = difflib.get_close_matches(name, names, n=4, cutoff=0.6)
        hint = f"; similar: {', '.join(near)}" if near else "; see reasoning_gym.factory.DATASETS"
        option = "dataset" if where == "env" else "name"
        raise ConfigError(f"{where}.{option}={name}: no such reasoning-gym dataset" + (
            " (a mixture is env.datasets)" if name == "composite" else hint))
    config_class = DATASETS[name][1]
    fields = [f.name for f in dataclasses.fields(config_class) if f.name not in RESERVED]
    for key in params:
        if key in RESERVED:
            raise ConfigError(f"{where}.params.{key}: marl sets it (the seed from each task, the size 1)")
        if key not in fields:
            near = difflib.get_close_matches(key, fields, n=3, cutoff=0.5)
            raise ConfigError(f"{where}.params.{key}: reasoning-gym's {name} has no such field" +
                              (f"; similar: {', '.join(near)}" if near else f"; fields: {', '.join(fields)}"))
    try:
        config = config_class(**typed(name, params))
        if hasattr(config, "validate"):
            config.validate()
    except Exception as exc:  # the library's validate raises AssertionError, ValueError or TypeError
        raise ConfigError(f"{where}.params={params}: reasoning-gym's {name} refuses them "
                          f"({' '.join(str(exc).split())[:200] or type(exc).__name__})") from None


def spec_of(cfg: Any) -> Spec:
    """The checked ``Spec`` of ``cfg``: its mixture (``env.datasets``) or its one dataset."""
    library()
    parts = [(str(p["name"]), float(p.get("weight", 1.0)), plain(p.get("params")) or {})
             for p in plain(cfg.datasets) or []]
    mixture = bool(parts)
    if not mixture:
        parts = [(cfg.dataset, 1.0, plain(cfg.params) or {})]
    names = [name for name, _, _ in parts]
    if len(set(names)) != len(names):
        raise ConfigError(f"env.datasets names a dataset twice ({', '.join(names)}): the library's composite "
                          "keeps one of each")
    for i, (name, weight, params) in enumerate(parts):
        where = f"env.datasets[{i}]" if mixture else "env"
        if weight <= 0:
            raise ConfigError(f"env.datasets[{i}].weight must be positive, got {weight}")
        check_part(name, params, where)
    return Spec(tuple((n, w, json.dumps(p, sort_keys=True)) for n, w, p in parts), mixture)


def build(spec: Spec, seed: int) -> Any:
    """The library's dataset of ``spec`` built with ``seed`` and size 1 (the composite one for a mixture)."""
    import reasoning_gym
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    if not spec.mixture:
        name, _, params = spec.parts[0]
        return reasoning_gym.create_dataset(name, seed=seed, size=1, **typed(name, json.loads(params)))
    parts = [DatasetSpec(name, weight, typed(name, json.loads(params))) for name, weight, params in spec.parts]
    return CompositeDataset(CompositeConfig(size=1, seed=seed, datasets=parts))


def library_entry(spec: Spec, seed: int) -> dict[str, Any] | str:
    """Entry 0 of the dataset built with ``seed``, Python's global generator seeded by it (restored after); where the
    library's generator gives up on the seed (a maze of the asked distance not found in its retries), why."""
    with own_random():
        random.seed(seed)
        try:
            return build(spec, seed)[0]
        except Exception as exc:  # the library raises RuntimeError, ValueError, ... when a generator gives up
            return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


@lru_cache(maxsize=4096)
def draw_task(spec: Spec, seed: int, holdout: bool) -> ReasoningTask:
    """The task of ``seed``: the first seed of its chain (``seed``, then draws of ``Random(seed)``) whose question
    lies on the requested side (evaluation when ``holdout``); a seed the library's generator gives up on is skipped,
    ``MAX_FAILURES`` of them are a ConfigError."""
    chain, names = random.Random(seed), "+".join(name for name, _, _ in spec.parts)
    candidate, failures = seed, 0
    for _ in range(MAX_DRAWS):
        entry = library_entry(spec, candidate)
        if isinstance(entry, str):
            failures += 1
            if failures == MAX_FAILURES:
                raise ConfigError(f"reasoning-gym's {names} could not generate a task from seed {candidate} "
                                  f"({entry}); change env.params")
        elif held_out(entry["question"]) == holdout:
            return ReasoningTask(candidate, entry)
        candidate = chain.randrange(SEED_SPAN)
    side = "evaluation" if holdout else "training"
    raise ConfigError(f"reasoning-gym's {names} gave no {side}-side question in {MAX_DRAWS} draws: its parameters "
                      "allow too few distinct questions for a held-out split")


def check_reasoning_gym(cfg: Any) -> None:
    """The package is installed, the datasets exist and take their parameters, and both splits have a task."""
    env = ReasoningGymEnv(cfg.env, 0)
    env.task("train", 0)
    env.task("eval", 0)


@ENVS.register("reasoning_gym", schema=ReasoningGymConfig, check=check_reasoning_gym)
class ReasoningGymEnv(Env):
    """A reasoning-gym dataset: its questions, scored by its own ``score_answer``; the oracle is its gold answer."""

    def __init__(self, cfg: Any, seed: int = 0, sandbox: Any = None):
        super().__init__(cfg, seed, sandbox)
        self.spec = spec_of(cfg)
        self.scorer = build(self.spec, 0)

    def make_task(self, seed: int) -> ReasoningTask:
        return draw_task(self.spec, seed, seed >= EVAL_SEED_BASE)

    def rules(self) -> str:
        return self.cfg.rules

    def initial_state(self, task: ReasoningTask) -> AnswerState:
        return AnswerState(task=task)

    def observe(self, state: AnswerState) -> str:
        question = state.task.question.strip()
        if state.answer is None:
            return question
        return f"{question}\nYour last answer {state.answer!r} scored {state.score:.2f}; try again."

    def library_score(self, answer: str, task: ReasoningTask) -> float | None:
        """The library's score of ``answer`` on ``task``; None where its scorer raises."""
        try:
            return float(self.scorer.score_answer(answer, task.entry))
        except Exception:  # a scorer that cannot read the answer: a format failure, never a crash
            return None

    def step(self, state: AnswerState, action: str | None) -> Transition:
        score = None if action is None else self.library_score(action, state.task)
        info = {"library_score": score or 0.0, "solved": float(score == 1.0)}
        return answer_step(state, action, score, self.cfg, score or 0.0, info)

    def score(self, state: AnswerState) -> float:
        return state.score

    def oracle(self, state: AnswerState) -> str | None:
        gold = state.task.entry.get("answer")
        gold = gold.strip() if isinstance(gold, str) else ""
        return gold if gold and self.library_score(gold, state.task) == 1.0 else None
