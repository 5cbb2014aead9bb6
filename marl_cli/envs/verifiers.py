"""Environments written for verifiers (Prime Intellect's classic API, ``import verifiers as vf``: the Environments
Hub's environments, prime-rl's) as marl environments, unchanged: ``env=verifiers env.env_id=<id>`` loads an
installed one with the library's own ``vf.load_environment(env_id, **env.env_args)`` (``env.path``: a folder put on
``sys.path`` first, so an environment that is not pip-installed loads by id too). verifiers 0.4 keeps only its
``verifiers.v1`` agent stack (harnesses that run their own loop), which marl cannot drive turn by turn: marl needs
``verifiers<0.4`` (0.2 and 0.3 have the classic API; 0.3 beside ``v1``).

The mapping, where marl generates every reply of the model and the library does all the rest, as in
``vf.MultiTurnEnv.rollout``:

- a task is a row of the environment's dataset: training rows come from ``env.train_split`` (``train``: its
  ``dataset``, ``eval``: its ``eval_dataset``) in an order shuffled by the run seed, evaluation rows from
  ``env.eval_split`` in order. When both name one split its last ``env.eval_size`` rows are evaluation's alone, and
  a training row whose prompt is an evaluation row's is dropped: the two never share a prompt.
- the observation is the conversation so far (the row's prompt, the replies, the environment's responses) as text:
  one message as it is, several as ``User:`` / ``Assistant:`` / ``Tool result:`` blocks; the row's system message
  first (``env.system=inline``) or not at all (``drop``). A tool environment's tools are listed before it, with the
  call syntax ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
- the answer (what the workflow passes: the text after its answer marker, or with ``workflow.answer_marker=''`` the
  whole reply, which is what an environment whose parser reads the whole message wants) is the assistant message's
  content; in a tool environment its
  ``<tool_call>`` blocks become the message's tool calls. The library adds it to the rollout
  (``add_model_response``), checks its stop conditions (``is_completed``) and, when none fired, builds the next
  prompt (``get_prompt_messages``: its ``env_response``). The ``env.actions_per_episode``-th answer ends the episode
  like the library's own ``max_turns``. No answer at all is a format failure: ``env.format_penalty``, the episode
  ends and the environment never sees it.
- reward: when the episode ends the library finishes the rollout (``cleanup``: the completion rendered) and its
  rubric scores it (``score_rollout``): that score, as it is, is the last step's reward (earlier steps pay 0), and
  ``Transition.info`` holds it (``rubric``) and each reward function's own score (``rubric/<name>``). Solved: a
  reward of at least ``env.success_reward`` (default: the environment's ``pass_threshold``). ``score`` is 1 when
  solved, else the reward mapped linearly from the rubric's range onto [0, 1] and clipped: ``env.reward_range``, by
  default [sum of the negative weights, sum of the positive weights] (reward functions score in [0, 1] by the
  library's convention): with rewards in [0, 1.2] and a pass_threshold of 0.5, an unsolved 0.3 scores 0.25.
- states branch (marl may score several candidate answers from one state): each step works on a deep copy of the
  library's rollout state (its client shared, its usage tracker rebuilt through the tracker's own methods).
- the oracle (warm starts) is ``env.demo`` with ``{answer}`` replaced by the row's ``answer``.

Not supported, each refused in one line: an environment that is not a ``vf.MultiTurnEnv`` (``EnvGroup``, the
experimental CLI-agent ones), a ``vf.SandboxEnv`` (``PythonEnv``: the model's code runs in Prime's remote sandboxes,
a container and a live Python REPL kept for a whole rollout, which marl's sandbox, one fresh program per run, cannot
stand in for), a rubric with group reward functions (marl scores each episode alone), and an environment that asks
the model for replies of its own (the rollout's client points nowhere). A ``vf.ToolEnv``'s tools are the
environment's own Python functions and run in this process, as under the library. The library's rollout timeout
(``timeout_seconds``) does not apply: marl generates between the library's calls.

verifiers is an optional dependency (``pip install 'marl[verifiers]'``), imported only when an environment loads.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import copy
import difflib
import importlib
import importlib.util
import json
import logging
import pkgutil
import random
import re
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import EnvConfig, bounded, choices
from marl_cli.envs.base import ENVS, WARMSTART_OFFSET, Env, Transition, plain

log = logging.getLogger(__name__)
INSTALL = "pip install 'marl[verifiers]'"
NEEDS = f"env=verifiers needs verifiers: {INSTALL}"
NOWHERE = "http://127.0.0.1:9/v1"
"""The rollout client's endpoint (the discard port): marl generates the model's replies, the client is never asked."""
MODEL = "marl"
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
LABELS = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool result"}
Split = choices("Split", "train", "eval", module=__name__)
SystemRule = choices("SystemRule", "inline", "drop", module=__name__)


@dataclass
class VerifiersConfig(EnvConfig):
    """A verifiers environment (classic API), loaded by id."""

    name: str = "verifiers"
    env_id: str = "retry-arithmetic"  # an installed environment (its module: the id, - as _, after the last /)
    env_args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of its load_environment
    path: str = "examples/verifiers_envs"  # a folder put first on sys.path (an env not pip-installed); "" none
    train_split: Split = Split.train  # training rows: the env's dataset (train) or eval_dataset (eval)
    eval_split: Split = Split.eval  # evaluation rows; the same split as training: its last eval_size rows
    system: SystemRule = SystemRule.inline  # the row's system message: first in the observation, or dropped
    rules: str = "Reply as the assistant in the conversation below."  # the line shown before the conversation
    demo: str = "{answer}"  # warm starts: the reply stating a row's answer ({answer} replaced); "" none
    success_reward: float | None = None  # solved: a rubric reward of at least this; None: the env's pass_threshold
    reward_range: list[float] = field(default_factory=list)  # [lo, hi]: rubric rewards scored 0 and 1; []: its weights
    format_penalty: float = bounded(-1.0, le=0.0)  # no answer after the marker: the episode ends with this reward


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def installed() -> Any:
    """The verifiers package root (light: the classic API loads on first use); a one-line ConfigError when it is
    missing or is 0.4 or later (no classic API)."""
    from packaging.version import InvalidVersion, Version

    try:
        import verifiers
    except ImportError:
        raise ConfigError(NEEDS) from None
    version = getattr(verifiers, "__version__", "0")
    with contextlib.suppress(InvalidVersion):
        if Version(version) >= Version("0.4"):
            raise ConfigError(f"env=verifiers drives verifiers' classic API (vf.MultiTurnEnv), which verifiers "
                              f"{version} no longer has: pip install 'verifiers>=0.2.1,<0.4' ({INSTALL})")
    return verifiers


def module_name(env_id: str) -> str:
    """The module ``vf.load_environment`` imports for ``env_id`` (its rule: ``-`` as ``_``, after the last ``/``)."""
    return env_id.replace("-", "_").split("/")[-1]


def on_path(folder: str) -> None:
    """Put ``folder`` (resolved) first on ``sys.path`` unless it is there; a one-line ConfigError if it is missing."""
    if not folder:
        return
    where = Path(folder).expanduser().resolve()
    if not where.is_dir():
        raise ConfigError(f"env.path={folder}: no such folder")
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))


def find_module(cfg: Any) -> Any:
    """The import spec of ``cfg.env_id``'s module, without importing it; a one-line ConfigError naming close ids
    in ``env.path`` when there is none."""
    installed()
    on_path(cfg.path)
    name = module_name(cfg.env_id)
    try:
        spec = importlib.util.find_spec(name) if name else None
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        return spec
    where = f" or in env.path={cfg.path}" if cfg.path else ""
    near = difflib.get_close_matches(name, [m.name for m in pkgutil.iter_modules([cfg.path])], n=4, cutoff=0.6) \
        if cfg.path else []
    hint = f"; similar: {', '.join(m.replace('_', '-') for m in near)}" if near else ""
    raise ConfigError(f"env.env_id={cfg.env_id}: no verifiers environment {name} is installed{where} "
                      f"(prime env install {cfg.env_id}, or pip install it){hint}")


def declared_args(spec: Any) -> tuple[list[str], bool] | None:
    """The parameter names of the module's ``load_environment`` and whether it takes ``**kwargs``, read from its
    source without importing it; None when the source does not define it plainly."""
    origin = Path(spec.origin or "")
    if origin.suffix != ".py" or not origin.is_file():
        return None
    try:
        tree = ast.parse(origin.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "load_environment":
            args = node.args
            return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)], args.kwarg is not None
    return None


def check_args(spec: Any, cfg: Any) -> None:
    """``env.env_args`` names only parameters the module's ``load_environment`` declares (when its source says)."""
    declared = declared_args(spec)
    if declared is None or declared[1]:
        return
    names, _ = declared
    unknown = sorted(set(plain(cfg.env_args)) - set(names))
    if unknown:
        raise ConfigError(f"env.env_args: {cfg.env_id}'s load_environment takes no {', '.join(unknown)}; it takes: "
                          f"{', '.join(names) or 'nothing'}")


@contextlib.contextmanager
def own_signals() -> Iterator[None]:
    """SIGINT and SIGTERM handled as before the block (a verifiers Environment installs handlers of its own)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in saved.items():
                signal.signal(sig, handler)


@contextlib.contextmanager
def quiet(vf: Any) -> Iterator[None]:
    """The library's log and the datasets progress bars silent in the block (a refusal is one line)."""
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        with vf.log_level("CRITICAL"):
            yield
    finally:
        if shown:
            datasets.enable_progress_bars()


_LOADED: dict[str, Any] = {}
"""Environments loaded in this process, by (env_id, path, env_args): the config check's load serves the run."""


def load_env(cfg: Any) -> Any:
    """The library's environment for ``cfg`` (loaded once per process); a one-line ConfigError when the library
    cannot load it or marl cannot drive it."""
    args = plain(cfg.env_args)
    key = json.dumps([cfg.env_id, cfg.path, args], sort_keys=True, default=str)
    if key not in _LOADED:
        find_module(cfg)
        vf = installed()
        with own_signals(), quiet(vf):
            try:
                env = vf.load_environment(cfg.env_id, **args)
            except Exception as exc:
                cause = exc.__cause__ or exc
                raise ConfigError(f"env.env_id={cfg.env_id}: verifiers cannot load it with env.env_args={args} "
                                  f"({one_line(cause)})") from None
        refuse_unsupported(vf, env, cfg.env_id)
        _LOADED[key] = env
    return _LOADED[key]


def refuse_unsupported(vf: Any, env: Any, env_id: str) -> None:
    """A one-line ConfigError for an environment marl cannot drive (see the module's docstring)."""
    if not isinstance(env, vf.MultiTurnEnv):
        raise ConfigError(f"env.env_id={env_id} is a {type(env).__name__}: marl plays the turns of a vf.MultiTurnEnv "
                          "(SingleTurnEnv, ToolEnv, ...), not of an env that runs its own loop")
    sandboxed = getattr(vf, "SandboxEnv", None)  # None where the library's sandbox extras do not import
    if sandboxed is not None and isinstance(env, sandboxed):
        raise ConfigError(f"env.env_id={env_id} is a {type(env).__name__}: it runs the model's code in Prime's remote "
                          "sandboxes (a container and a live Python REPL per rollout), which marl's sandbox (one "
                          "fresh program per run) cannot stand in for")
    if env.rubric.has_group_rewards:
        raise ConfigError(f"env.env_id={env_id}: its rubric has group reward functions (rollouts scored together); "
                          "marl scores each episode alone")


def rubric_range(rubric: Any) -> tuple[float, float]:
    """[sum of negative weights, sum of positive weights] over the rubric's reward functions (a group's: its
    rubrics')."""
    parts = getattr(rubric, "rubrics", None)
    if parts is not None:
        ranges = [rubric_range(part) for part in parts]
        return sum(lo for lo, _ in ranges), sum(hi for _, hi in ranges)
    weights = list(rubric.weights)
    return sum(min(w, 0.0) for w in weights), sum(max(w, 0.0) for w in weights)


def reward_bounds(env: Any, cfg: Any) -> tuple[float, float, float]:
    """(lo, hi, solved-at) of the rubric's reward; a one-line ConfigError when the range is empty or nothing in it
    counts as solved."""
    given = plain(cfg.reward_range)
    if given and len(given) != 2:
        raise ConfigError(f"env.reward_range must be [lo, hi], got {given}")
    lo, hi = (float(v) for v in given) if given else rubric_range(env.rubric)
    if hi <= lo:
        raise ConfigError(f"env.reward_range: the rubric's rewards span [{lo}, {hi}]; set env.reward_range=[lo,hi] "
                          "with lo < hi")
    solved = env.pass_threshold if cfg.success_reward is None else cfg.success_reward
    if solved > hi:
        raise ConfigError(f"env.success_reward={solved} is above the rubric's highest reward {hi}: nothing would be "
                          "solved (set env.success_reward or env.reward_range)")
    return lo, hi, float(solved)


DATASETS = {"train": "dataset", "eval": "eval_dataset"}
"""The environment's dataset attribute of each split."""


def has_split(env: Any, split: str) -> bool:
    """Whether the environment has the dataset of ``split`` (built, or a source to build it from)."""
    return getattr(env, DATASETS[split]) is not None or getattr(env, f"{DATASETS[split]}_source") is not None


def check_verifiers(cfg: Any) -> None:
    """verifiers is installed with its classic API, the id names an installed environment whose ``load_environment``
    takes ``env.env_args`` and loads, marl can drive it, the splits named build, and its reward range is usable."""
    spec = find_module(cfg.env)
    check_args(spec, cfg.env)
    env = load_env(cfg.env)
    for key in ("train_split", "eval_split"):
        split = str(cfg.env[key])
        if not has_split(env, split):
            other = "eval" if split == "train" else "train"
            raise ConfigError(f"env.{key}={split}: {cfg.env.env_id} has no {DATASETS[split]}; set env.{key}={other}")
    split_rows(env, cfg.env)
    reward_bounds(env, cfg.env)


_LOOP: list[asyncio.AbstractEventLoop] = []
"""The event loop the library's coroutines run on in this process (an environment may hold loop-bound objects)."""


def run(coroutine: Any) -> Any:
    """Run one of the library's coroutines to its end."""
    if not _LOOP or _LOOP[0].is_closed():
        _LOOP[:] = [asyncio.new_event_loop()]
    return _LOOP[0].run_until_complete(coroutine)


def prompt_key(row: Mapping[str, Any]) -> str:
    return json.dumps(row.get("prompt"), sort_keys=True, default=str)


def split_rows(env: Any, cfg: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training and evaluation rows (see the module's docstring): never a prompt in both."""
    sets: dict[str, list[dict[str, Any]]] = {}
    for split in {str(cfg.train_split), str(cfg.eval_split)}:
        try:
            with quiet(installed()):
                built = env.build_dataset() if split == "train" else env.build_eval_dataset()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"env.env_id={cfg.env_id}: its {DATASETS[split]} does not build ({one_line(exc)})") \
                from None
        sets[split] = [] if built is None else built.to_list()
    train, evals = sets[str(cfg.train_split)], sets[str(cfg.eval_split)]
    if cfg.train_split == cfg.eval_split:
        if len(train) <= cfg.eval_size:
            raise ConfigError(f"env.eval_size={cfg.eval_size}: the {DATASETS[str(cfg.eval_split)]} of {cfg.env_id} has "
                              f"{len(train)} rows, which training and evaluation share; lower env.eval_size")
        train, evals = train[:-cfg.eval_size], train[-cfg.eval_size:]
    held = {prompt_key(row) for row in evals}
    kept = [row for row in train if prompt_key(row) not in held]
    if len(kept) < len(train):
        log.warning("env: dropped %d training rows of %s whose prompt is an evaluation row's", len(train) - len(kept),
                    cfg.env_id)
    if not kept or not evals:
        raise ConfigError(f"env.env_id={cfg.env_id}: no {'training' if not kept else 'evaluation'} rows left")
    if cfg.eval_size > len(evals):
        log.warning("env.eval_size=%d exceeds the %d evaluation rows of %s: rows repeat", cfg.eval_size, len(evals),
                    cfg.env_id)
    return kept, evals


def text_of(content: Any) -> str:
    """A message's content as text (a non-text part as ``[<type>]``)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = [part.get("text") if part.get("type") == "text" else f"[{part.get('type')}]" for part in content]
    return "\n".join(str(part) for part in parts)


def call_text(call: Any) -> str:
    """A tool call in the syntax marl asks the model for."""
    try:
        arguments = json.loads(call.get("arguments"))
    except (TypeError, ValueError):
        arguments = call.get("arguments")
    return f"<tool_call>{json.dumps({'name': call.get('name'), 'arguments': arguments})}</tool_call>"


def message_text(message: Any) -> str:
    calls = [call_text(call) for call in message.get("tool_calls") or []]
    return "\n".join(part for part in (text_of(message.get("content")), *calls) if part)


def transcript(messages: list[Any], system: bool) -> str:
    """The conversation as text: one message as it is, several as labelled blocks."""
    shown = [m for m in messages if system or m.get("role") != "system"]
    if len(shown) == 1:
        return message_text(shown[0])
    return "\n\n".join(f"{LABELS.get(m.get('role'), str(m.get('role')).title())}: {message_text(m)}" for m in shown)


def tools_text(tools: list[Any]) -> str:
    """The tools a reply may call, and how (empty without tools)."""
    if not tools:
        return ""
    lines = ['Tools: call one with <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>; its result comes '
             'back as "Tool result".']
    for tool in tools:
        params = (tool.parameters or {}).get("properties", {})
        listed = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in params.items())
        lines.append(f"- {tool.name}({listed}): {tool.description}")
    return "\n".join(lines)


def model_response(vf: Any, text: str, tools: bool, turn: int) -> Any:
    """The library's Response for the reply ``text``: its ``<tool_call>`` blocks as tool calls when the rollout has
    tools (a block that is not JSON with a name stays text)."""
    calls: list[Any] = []

    def take(match: re.Match[str]) -> str:
        try:
            spec = json.loads(match.group(1))
            name, arguments = spec["name"], spec.get("arguments", {})
        except (ValueError, KeyError, TypeError, AttributeError):
            return match.group(0)
        if not isinstance(name, str):
            return match.group(0)
        calls.append(vf.ToolCall(id=f"call_{turn}_{len(calls)}", name=name,
                                 arguments=arguments if isinstance(arguments, str) else json.dumps(arguments)))
        return ""

    rest = TOOL_CALL.sub(take, text).strip() if tools else text
    content = (rest or None) if calls else text
    message = vf.ResponseMessage(content=content, finish_reason="tool_calls" if calls else "stop", is_truncated=False,
                                 tool_calls=calls or None)
    return vf.Response(id=f"{MODEL}-{turn}", created=0, model=MODEL, message=message)


@dataclass(frozen=True, eq=False)
class VerifiersState:
    """An episode: the dataset row, the library's rollout state (never changed once stored: a step copies it), the
    messages the model replies to next (empty once over) and, once over, the rubric's reward."""

    row: Mapping[str, Any] = field(repr=False)
    rollout: Any = field(repr=False)
    prompt: tuple[Any, ...] = field(repr=False)
    actions: int = 0
    done: bool = False
    reward: float = 0.0
    solved: bool = False
    format_failure: bool = False


@ENVS.register("verifiers", schema=VerifiersConfig, check=check_verifiers)
class VerifiersEnv(Env):
    """A verifiers environment: its dataset's rows as tasks, its loop for the turns, its rubric for the reward."""

    def __init__(self, cfg: Any, seed: int = 0, sandbox: Any = None):
        super().__init__(cfg, seed, sandbox)
        self.env = load_env(cfg)
        self.vf = installed()
        from verifiers.clients import resolve_client

        self.client = resolve_client(self.vf.ClientConfig(api_base_url=NOWHERE, max_retries=0))
        self.lo, self.hi, self.solved_at = reward_bounds(self.env, cfg)
        self.train_rows, self.eval_rows = split_rows(self.env, cfg)
        self.order = random.Random(seed).sample(range(len(self.train_rows)), len(self.train_rows))
        if 0 < self.env.max_turns != cfg.actions_per_episode:
            log.info("env: %s allows %d turns, marl's episodes %d (env.actions_per_episode)", cfg.env_id,
                     self.env.max_turns, cfg.actions_per_episode)

    def task(self, split: str, index: int) -> Mapping[str, Any]:
        """Evaluation row ``index`` (modulo the rows), or a training row in the run's shuffled order."""
        if split == "eval":
            return self.eval_rows[index % len(self.eval_rows)]
        if split not in ("train", "warmstart"):
            raise ValueError(f"unknown split {split!r}; expected train, warmstart or eval")
        index += WARMSTART_OFFSET if split == "warmstart" else 0
        return self.train_rows[self.order[index % len(self.order)]]

    def make_task(self, seed: int) -> Mapping[str, Any]:
        return self.train_rows[seed % len(self.train_rows)]

    def rules(self) -> str:
        return self.cfg.rules

    def initial_state(self, task: Mapping[str, Any]) -> VerifiersState:
        rollout, prompt = run(self._start(task))
        state = VerifiersState(row=task, rollout=rollout, prompt=tuple(prompt or ()))
        return state if prompt is not None else self._ended(state, rollout, 0)[0]

    def observe(self, state: VerifiersState) -> str:
        messages = list(state.prompt) or [*state.rollout["prompt"], *(state.rollout.get("completion") or [])]
        tools = tools_text(state.rollout.get("tool_defs") or [])
        conversation = transcript(messages, self.cfg.system == "inline")
        return f"{tools}\n\n{conversation}" if tools else conversation

    def step(self, state: VerifiersState, action: str | None) -> Transition:
        """Add the reply ``action`` to a copy of the rollout and run the library's loop to the next prompt or the end
        (then the rubric scores the rollout); no reply ends the episode as a format failure."""
        if state.done:
            raise ValueError("the episode is over")
        actions = state.actions + 1
        if action is None:
            new = replace(state, prompt=(), actions=actions, done=True, reward=self.cfg.format_penalty,
                          format_failure=True)
            return Transition(new, self.cfg.format_penalty, True, False, False, {"format_failure": 1.0})
        rollout = self._copy(state.rollout)
        prompt = run(self._reply(rollout, list(state.prompt), action, actions >= self.cfg.actions_per_episode))
        if prompt is not None:
            return Transition(replace(state, rollout=rollout, prompt=tuple(prompt), actions=actions), 0.0, False,
                              False, True, {})
        new, info = self._ended(state, rollout, actions)
        return Transition(new, new.reward, True, new.solved, True, info)

    def score(self, state: VerifiersState) -> float:
        """1 when solved; else the reward mapped from the rubric's range onto [0, 1] (0 before the end)."""
        if state.solved:
            return 1.0
        if not state.done or state.format_failure:
            return 0.0
        return min(1.0, max(0.0, (state.reward - self.lo) / (self.hi - self.lo)))

    def oracle(self, state: VerifiersState) -> str | None:
        """``env.demo`` stating the row's answer (None without one, or once over)."""
        answer = state.row.get("answer")
        if state.done or not self.cfg.demo or answer is None or str(answer) == "":
            return None
        return self.cfg.demo.replace("{answer}", str(answer))

    # -- the library's loop (``vf.MultiTurnEnv.rollout``), one reply at a time -----------------------------------

    async def _start(self, row: Mapping[str, Any]) -> tuple[Any, list[Any] | None]:
        """A new rollout of ``row`` (the library's ``init_state`` and ``setup_state``) and its first prompt (None: it
        ended before any reply, and is scored)."""
        rollout = await self.env.init_state(dict(row), self.client, MODEL, copy.deepcopy(self.env.sampling_args))
        try:
            rollout = await self.env.setup_state(rollout) or rollout
        except self.vf.Error as exc:
            rollout["error"] = exc
        prompt = await self._advance(rollout, last=False)
        if prompt is None:
            await self._finish(rollout)
        return rollout, prompt

    async def _reply(self, rollout: Any, prompt: list[Any], text: str, last: bool) -> list[Any] | None:
        """Add the reply ``text`` to ``rollout``; the next prompt, or None once over (the rollout scored)."""
        turn = len(rollout["trajectory"])
        response = model_response(self.vf, text, bool(rollout.get("tool_defs")), turn)
        await self.env.add_model_response(rollout, prompt, response)
        following = await self._advance(rollout, last)
        if following is None:
            await self._finish(rollout)
        return following

    async def _advance(self, rollout: Any, last: bool) -> list[Any] | None:
        """The library's loop up to the model's next turn: the next prompt, or None when a stop condition fired (or
        ``last``: marl's episode ends, like the library's ``max_turns``)."""
        from verifiers.utils.message_utils import maybe_normalize_messages

        while not await self.env.is_completed(rollout):
            if last:
                rollout["is_completed"] = True
                rollout["stop_condition"] = "actions_per_episode"
                return None
            try:
                prompt = await self.env.get_prompt_messages(rollout)
                prompt = maybe_normalize_messages(prompt, field_name="prompt_messages")
                if rollout.get("final_env_response") is None:
                    return prompt
            except self.vf.OverlongPromptError:
                rollout["prompt_too_long"] = True
                rollout["is_truncated"] = True
            except self.vf.Error as exc:
                rollout["error"] = exc
        return None

    async def _finish(self, rollout: Any) -> None:
        """The library's end of a rollout: its cleanup (the completion rendered), the rubric's score, the rubric's
        cleanup."""
        await self.env.cleanup(rollout)
        if self.env.score_rollouts:
            await self.env.rubric.score_rollout(rollout)
        else:
            await self.env.rubric.dummy_score_rollout(rollout)
        await self.env.rubric.cleanup(rollout)

    def _ended(self, state: VerifiersState, rollout: Any, actions: int) -> tuple[VerifiersState, dict[str, float]]:
        """``state`` over with ``rollout``'s score, and the info of its last step (the rubric's total and scores)."""
        error = rollout.get("error")
        if isinstance(error, self.vf.ModelError):
            raise ConfigError(f"env.env_id={self.cfg.env_id} asked the rollout's model for a reply of its own "
                              f"({one_line(error.__cause__ or error)}); marl generates only the policy's replies")
        reward = float(rollout.get("reward") or 0.0)
        info = {"rubric": reward, **{f"rubric/{name}": float(value)
                                     for name, value in (rollout.get("metrics") or {}).items()}}
        info["error"] = float(error is not None)
        new = replace(state, rollout=rollout, prompt=(), actions=actions, done=True, reward=reward,
                      solved=reward >= self.solved_at)
        return new, info

    def _copy(self, rollout: Any) -> Any:
        """A deep copy of the library's rollout state: the client shared, the usage tracker rebuilt by its own
        methods (it holds a read-only view that does not copy)."""
        memo: dict[int, Any] = {id(self.client): self.client}
        tracker = rollout.get("usage_tracker")
        if tracker is not None:
            fresh = type(tracker)()
            totals = tracker.snapshot()
            if totals is not None:
                fresh.increment(totals["input_tokens"], totals["output_tokens"])
            memo.update({id(tracker): fresh, id(tracker.usage): fresh.usage})
        try:
            return copy.deepcopy(rollout, memo)
        except Exception as exc:
            raise ConfigError(f"env.env_id={self.cfg.env_id}: its rollout state holds what cannot be copied "
                              f"({one_line(exc)}); marl copies a state at each step so candidates branch from it") \
                from None
