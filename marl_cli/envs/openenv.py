"""Environments written for OpenEnv (``openenv-core``, the environment spec TRL trains on) as marl environments,
unchanged: in-process by the Environment class's import path (``env=openenv env.environment=my_pkg.server:MyEnv``,
or ``path/to/file.py:MyEnv``), or through the library's own client against a running server of it
(``env.base_url=http://127.0.0.1:8000``). Either way the environment's own ``reset``/``step`` decide everything.

The mapping (TRL's: a group's episodes start from one reset seed; the reward is the environment's):

- a task is a seed, passed to ``reset(seed=...)``: train, warm-start and evaluation seeds never overlap, and the K
  episodes of a group start from the same one. In-process, an Environment whose ``reset`` takes no seed is refused.
  A server drops a seed its environment's ``reset`` does not take (marl cannot see that): every task is then the
  environment's own draw, evaluation tasks may be training ones, and a replay (below) fails when its draw differs.
- the observation shown is the observation's public fields (all but reward, done and metadata: what the library's
  server sends) as ``name: value`` lines, non-text values as JSON; ``env.observation_field`` shows one field alone.
  The rules are ``env.rules``, else the environment's metadata description (``get_metadata``, ``/metadata``).
- the answer (the text after the workflow's answer marker) fills ``env.action_field`` (by default the Action's only
  text field), the Action's other fields come from ``env.action_extra``; the Action is validated as the server does
  (``deserialize_action``). No answer, or one the Action refuses, is a format failure: ``env.format_penalty``, and
  the environment never sees it. Anything the Action accepts goes to the environment, which scores it itself.
- reward = ``observation.reward`` (None counts 0), done = ``observation.done``; the ``env.actions_per_episode``-th
  answer ends an episode too. Solved: the episode ended on a reward of at least ``env.success_reward``; ``score``
  is 1 then, else 0.
- states branch (marl may score several candidate answers from one state). In-process a state holds its own deep
  copy of the Environment, which a step copies again. Through a server a state is its seed and the answers the
  environment took; marl keeps up to ``env.sessions`` WebSocket sessions, each at a known state, and a step from a
  state no session is at resets one with the seed and replays the answers, then checks that the replay gave the
  state's observation, reward and done: an environment that is not deterministic in its seed and actions cannot
  be branched through a server (a one-line error says so).
- the oracle (for warm starts) is ``env.oracle``: a function from an observation's public fields to an answer.

OpenEnv is an optional dependency (``pip install 'marl[openenv]'``), imported only when an environment is built.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.util
import inspect
import json
import sys
import typing
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import EnvConfig, bounded
from marl_cli.envs.base import ENVS, Env, Transition

INSTALL = "pip install 'marl[openenv]'"
NEEDS = f"env=openenv needs openenv-core: {INSTALL}"
HIDDEN = ("reward", "done", "metadata")
"""Observation fields the library's server sends apart (reward, done) or not at all (metadata)."""
PROBE_TIMEOUT = 2.0
"""Seconds a server has to answer marl's check (``/schema``, ``/metadata``) before it counts as unreachable."""


@dataclass
class OpenEnvConfig(EnvConfig):
    """An OpenEnv environment, in this process or on a server."""

    name: str = "openenv"
    environment: str = ""  # in-process: the Environment class, "package.module:Class" or "path/to/file.py:Class"
    base_url: str = ""  # or a running server of it (http://host:port), through the library's client; one of the two
    init: dict[str, Any] = field(default_factory=dict)  # in-process: keyword arguments of the class's constructor
    action_class: str = ""  # in-process: the Action class by import path; empty: step's annotation, else the
    # Environment[Action, ...] parameters
    action_field: str = ""  # the Action field the answer fills; empty: the Action's only text field
    action_extra: dict[str, Any] = field(default_factory=dict)  # fixed values of the Action's other fields
    observation_field: str = ""  # the observation field shown; empty: every public field, as "name: value" lines
    rules: str = ""  # the rules text shown; empty: the environment's metadata description
    success_reward: float = 1.0  # solved (score 1): the episode ended on a reward of at least this
    format_penalty: float = bounded(-1.0, le=0.0)  # no answer after the marker, or one the Action refuses
    oracle: str = ""  # warm starts: a function "module:name" from an observation's public fields to an answer
    sessions: int = bounded(1, ge=1)  # base_url: WebSocket sessions kept open (at most the server's
    # max_concurrent_envs, shared by every process of a run)


def plain(value: Any) -> dict[str, Any]:
    """A config mapping as a plain dict."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else dict(value)


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def load(spec: str, key: str) -> Any:
    """The object ``spec`` names, "package.module:Name" or "path/to/file.py:Name" (the file's folder joins
    ``sys.path`` and its module imports by its stem); a one-line ConfigError when it does not import."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ConfigError(f"{key}={spec}: name it as package.module:Name or path/to/file.py:Name")
    module_name, path = where, None
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"{key}={spec}: no such file {path}")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        module_name = path.stem
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "openenv":
            raise ConfigError(NEEDS) from None
        raise ConfigError(f"{key}={spec}: cannot import {module_name} ({one_line(exc)})") from None
    except Exception as exc:
        raise ConfigError(f"{key}={spec}: importing {module_name} failed ({one_line(exc)})") from None
    if path is not None and Path(module.__file__ or "").resolve() != path:
        raise ConfigError(f"{key}={spec}: the module name {module_name} is taken by {module.__file__}; rename the file")
    if not hasattr(module, name):
        raise ConfigError(f"{key}={spec}: module {module_name} has no {name}")
    return getattr(module, name)


def library() -> Any:
    """The library's server-side modules (``interfaces``, ``serialization``, ``types``) and pydantic's
    ValidationError, as a namespace; a one-line ConfigError naming the extra when openenv-core is missing."""
    try:
        from openenv.core.env_server import interfaces, serialization, types
        from pydantic import ValidationError
    except ImportError:
        raise ConfigError(NEEDS) from None
    return SimpleNamespace(Environment=interfaces.Environment, Action=types.Action,
                           WSObservationResponse=types.WSObservationResponse,
                           serialize_observation=serialization.serialize_observation,
                           deserialize_action=serialization.deserialize_action, ValidationError=ValidationError)


def installed() -> bool:
    """Whether openenv-core can be imported (without importing it: that takes seconds)."""
    try:
        return importlib.util.find_spec("openenv") is not None
    except (ImportError, ValueError):
        return False


def is_text(prop: Mapping[str, Any]) -> bool:
    """Whether a JSON-schema property takes a string (``str``, ``Optional[str]``, a string enum)."""
    return prop.get("type") == "string" or any(p.get("type") == "string" for p in prop.get("anyOf", []))


def action_field(schema: Mapping[str, Any], cfg: Any) -> str:
    """The Action field the answer fills (``env.action_field``, else the Action's only text field), checked against
    the Action's JSON schema with ``env.action_extra`` for its other required fields."""
    props = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    title, listed = schema.get("title", "the Action"), ", ".join(props) or "none"
    texts = [k for k, v in props.items() if is_text(v)]
    name = cfg.action_field
    if name and name not in props:
        raise ConfigError(f"env.action_field={name}: {title} has no such field; its fields: {listed}")
    if name and not is_text(props[name]):
        raise ConfigError(f"env.action_field={name}: {title}.{name} is not a text field; the answer is text")
    if not name and len(texts) != 1:
        raise ConfigError(f"env.action_field: {title} has {len(texts)} text fields ({', '.join(texts) or 'none'}); "
                          "name the one the answer fills")
    name = name or texts[0]
    extra = plain(cfg.action_extra)
    unknown = [k for k in extra if k not in props or k == name]
    if unknown:
        raise ConfigError(f"env.action_extra names {', '.join(unknown)}: not another field of {title} "
                          f"(its fields: {listed})")
    missing = [k for k in schema.get("required", []) if k != name and k not in extra]
    if missing:
        raise ConfigError(f"{title} also requires {', '.join(missing)}: give them in env.action_extra")
    return name


@dataclass
class Result:
    """What the environment answered a reset or a step with: the observation's public fields as the server sends
    them, its reward (None as 0) and done, and (in-process) the Environment in the state it left."""

    observation: dict[str, Any]
    reward: float
    done: bool
    env: Any = None

    @staticmethod
    def of(data: Mapping[str, Any], env: Any = None) -> Result:
        reward = data.get("reward")
        return Result(dict(data.get("observation") or {}), 0.0 if reward is None else float(reward),
                      bool(data.get("done")), env)


class Backend:
    """What both ways of running an environment share: the Action's schema, the field the answer fills, the
    observation's public fields and the environment's description."""

    schema: dict[str, Any]
    fields: list[str]
    description: str

    def settle(self, cfg: Any) -> None:
        """Pick the action field and check the observation field, once ``schema`` and ``fields`` are known."""
        self.field = action_field(self.schema, cfg)
        self.extra = plain(cfg.action_extra)
        if cfg.observation_field and cfg.observation_field not in self.fields:
            raise ConfigError(f"env.observation_field={cfg.observation_field}: the observation has no such public "
                              f"field; its fields: {', '.join(self.fields) or 'none'}")

    def payload(self, answer: str) -> dict[str, Any]:
        """The Action, as the JSON the server takes, that states ``answer``."""
        return {**self.extra, self.field: answer}

    def close(self) -> None:
        """Release what the backend holds (nothing by default)."""


def call(env: Any, name: str, base: type, *args: Any, **kwargs: Any) -> Any:
    """``env.<name>(...)`` as the library's server calls it: its ``<name>_async`` when the class overrides that."""
    method = getattr(env, f"{name}_async")
    if method.__func__ is not getattr(base, f"{name}_async"):
        return asyncio.run(method(*args, **kwargs))
    return getattr(env, name)(*args, **kwargs)


def action_class(cls: type, cfg: Any, lib: Any) -> type:
    """The Action class of Environment class ``cls``: ``env.action_class``, else step's annotation of its action,
    else the first parameter of ``Environment[...]`` among its bases."""
    if cfg.action_class:
        found = load(cfg.action_class, "env.action_class")
        if not (isinstance(found, type) and issubclass(found, lib.Action)):
            raise ConfigError(f"env.action_class={cfg.action_class} is not an OpenEnv Action (a subclass of "
                              "openenv.core.env_server.types.Action)")
        return found
    try:
        found = [typing.get_type_hints(cls.step).get("action")]
    except Exception:  # an annotation that does not resolve: look at the bases
        found = []
    for klass in cls.__mro__:
        found += [typing.get_args(base)[0] for base in getattr(klass, "__orig_bases__", ()) if typing.get_args(base)]
    for candidate in found:
        if isinstance(candidate, type) and issubclass(candidate, lib.Action) and candidate is not lib.Action:
            return candidate
    raise ConfigError(f"env.environment={cfg.environment}: cannot tell its Action class; annotate step's action "
                      "parameter or set env.action_class")


class LocalBackend(Backend):
    """The Environment class in this process: every state holds its own copy of the library's Environment."""

    def __init__(self, cfg: Any):
        self.cls = load(cfg.environment, "env.environment")  # first: a wrong path fails before seconds of imports
        self.lib = lib = library()
        where = f"env.environment={cfg.environment}"
        if not (isinstance(self.cls, type) and issubclass(self.cls, lib.Environment)):
            raise ConfigError(f"{where} is not an OpenEnv Environment (a subclass of "
                              "openenv.core.env_server.interfaces.Environment)")
        self.action_cls = action_class(self.cls, cfg, lib)
        self.schema = self.action_cls.model_json_schema()
        reset = self.cls.reset_async if self.cls.reset_async is not lib.Environment.reset_async else self.cls.reset
        params = inspect.signature(reset).parameters.values()
        if not any(p.name == "seed" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            raise ConfigError(f"{where}: its reset takes no seed, and marl's tasks are reset seeds (train and eval "
                              "seeds never overlap); give reset a seed parameter")
        try:
            self.template = self.cls(**plain(cfg.init))
            self.description = self.template.get_metadata().description
            first = self.reset(0)
            copy.deepcopy(first.env)
        except Exception as exc:
            raise ConfigError(f"{where}: building it (env.init={plain(cfg.init)}), resetting it with seed 0 and "
                              f"copying it failed ({one_line(exc)})") from None
        self.fields = list(first.observation)
        self.settle(cfg)

    def result(self, observation: Any, env: Any) -> Result:
        """``observation`` exactly as the library's server sends it (its own serialisation, through JSON)."""
        wire = self.lib.WSObservationResponse(data=self.lib.serialize_observation(observation)).model_dump_json()
        return Result.of(json.loads(wire)["data"], env)

    def reset(self, seed: int) -> Result:
        env = copy.deepcopy(self.template)
        return self.result(call(env, "reset", self.lib.Environment, seed=seed), env)

    def step(self, state: OpenEnvState, answer: str) -> Result | None:
        """The result of ``answer`` from ``state`` on a copy of its Environment; None when the Action refuses it."""
        try:
            action = self.lib.deserialize_action(self.payload(answer), self.action_cls)
        except self.lib.ValidationError:
            return None
        env = copy.deepcopy(state.env)
        return self.result(call(env, "step", self.lib.Environment, action), env)


Position = tuple[int, tuple[str, ...]]
"""A state as a server session knows it: the reset seed and the answers stepped since."""


class Refused(Exception):
    """The server refused an action as invalid for its Action class (the session is where it was)."""


def probe(url: str, path: str) -> dict[str, Any]:
    """The JSON a server answers ``GET <url><path>`` with, within ``PROBE_TIMEOUT``; a one-line ConfigError when
    nothing (or no OpenEnv server) answers."""
    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=PROBE_TIMEOUT) as reply:
            return json.load(reply)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConfigError(f"env.base_url={url}: no OpenEnv server answers {path} there ({type(exc).__name__}: "
                          f"{reason}); start the server or fix the URL") from None


class RemoteBackend(Backend):
    """A server of the environment, through the library's generic client: up to ``env.sessions`` WebSocket
    sessions, each at a known state (seed, answers; several may be at one), in order of last use: a step from a
    state no session is at takes a new session while under the limit, else the least recently used one."""

    def __init__(self, cfg: Any):
        self.url = cfg.base_url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"env.base_url={cfg.base_url}: give the server's http:// or https:// URL")
        schemas = probe(self.url, "/schema")
        self.schema = schemas.get("action") or {}
        props = (schemas.get("observation") or {}).get("properties", {})
        self.fields = [name for name in props if name not in HIDDEN]
        self.description = probe(self.url, "/metadata").get("description", "")
        self.limit = cfg.sessions
        self.live: list[tuple[Position, Any]] = []  # (state, session), least recently used first
        self.settle(cfg)

    def _take(self) -> Any:
        """A session to reset: a new one while under ``env.sessions``, else the least recently used one."""
        if len(self.live) < self.limit:
            from openenv.core.generic_client import GenericEnvClient

            return GenericEnvClient(base_url=self.url).sync()
        return self.live.pop(0)[1]

    def _at(self, key: Position) -> Any:
        """A session at state ``key``, taken out of the pool (None when none is there)."""
        for i, (position, client) in enumerate(self.live):
            if position == key:
                del self.live[i]
                return client
        return None

    def _send(self, client: Any, method: str, *args: Any, **kwargs: Any) -> Result:
        """``client.<method>(...)`` as a Result; Refused for an action the server's Action class refuses, a one-line
        ConfigError (the session closed) for any other failure."""
        try:
            reply = getattr(client, method)(*args, **kwargs)
        except Exception as exc:
            if "VALIDATION_ERROR" in str(exc):
                raise Refused from None
            client.close()
            # at capacity the server sends CAPACITY_REACHED and hangs up as the session opens; the client may see
            # only the hang-up (its reset is sent after the close), so a hang-up with other sessions open reads alike
            hung_up = type(exc).__name__.startswith("ConnectionClosed") and bool(self.live)
            hint = ("; serve it with max_concurrent_envs >= env.sessions (for every process of the run)"
                    if "CAPACITY_REACHED" in str(exc) or hung_up else "")
            raise ConfigError(f"env.base_url={self.url}: {method} failed ({one_line(exc)}){hint}") from None
        return Result(dict(reply.observation), 0.0 if reply.reward is None else float(reply.reward),
                      bool(reply.done))

    def reset(self, seed: int) -> Result:
        client = self._take()
        result = self._send(client, "reset", seed=seed)
        self.live.append(((seed, ()), client))
        return result

    def _replay(self, state: OpenEnvState) -> Any:
        """A session brought to ``state``: reset with its seed, its answers replayed, the outcome checked."""
        client = self._take()
        result = self._send(client, "reset", seed=state.seed)
        try:
            for answer in state.answers:
                result = self._send(client, "step", self.payload(answer))
        except Refused:
            result = None
        if result is None or (result.observation, result.reward, result.done) != (state.observation, state.reward,
                                                                                  state.finished):
            client.close()
            raise ConfigError(f"env.base_url={self.url}: replaying seed {state.seed} and its {len(state.answers)} "
                              "answers gave another outcome than the first time; marl branches states by replay, so "
                              "the server's environment must be deterministic in its reset seed and the actions")
        return client

    def step(self, state: OpenEnvState, answer: str) -> Result | None:
        """The result of ``answer`` from ``state`` on a session at that state; None when the Action refuses it."""
        key = (state.seed, state.answers)
        client = self._at(key)
        if client is None:
            client = self._replay(state)
        try:
            result = self._send(client, "step", self.payload(answer))
        except Refused:
            self.live.append((key, client))
            return None
        self.live.append(((state.seed, (*state.answers, answer)), client))
        return result

    def close(self) -> None:
        while self.live:
            self.live.pop()[1].close()


def backend(cfg: Any) -> Backend:
    """The environment ``cfg`` names, in-process or on its server; a one-line ConfigError for a bad setting."""
    if bool(cfg.environment) == bool(cfg.base_url):
        raise ConfigError("env=openenv takes one of env.environment (an Environment class, e.g. "
                          "my_pkg.server:MyEnvironment) and env.base_url (a running server, e.g. http://127.0.0.1:8000)"
                          + (", not both" if cfg.environment else ""))
    if cfg.environment:
        return LocalBackend(cfg)
    for key in ("init", "action_class"):
        if cfg[key]:
            raise ConfigError(f"env.{key} sets up an in-process environment (env.environment); a server's is its own")
    if not installed():
        raise ConfigError(NEEDS)
    return RemoteBackend(cfg)


def oracle_of(cfg: Any) -> Callable[[dict[str, Any]], Any] | None:
    """The function ``env.oracle`` names (None when empty)."""
    if not cfg.oracle:
        return None
    found = load(cfg.oracle, "env.oracle")
    if not callable(found):
        raise ConfigError(f"env.oracle={cfg.oracle} is not a function")
    return found


def check_openenv(cfg: Any) -> None:
    """The environment imports (or its server answers), its Action takes the answer, the fields named exist."""
    backend(cfg.env).close()
    oracle_of(cfg.env)


@dataclass(frozen=True)
class OpenEnvState:
    """An episode: its seed, the answers the environment took, the latest observation's public fields, reward and
    done (``finished``), answers given (refused ones too), whether it is over and solved, and (in-process) the
    library's Environment in this state (never stepped itself: a step copies it)."""

    seed: int
    answers: tuple[str, ...] = ()
    observation: Mapping[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    finished: bool = False
    actions: int = 0
    over: bool = False
    solved: bool = False
    env: Any = field(default=None, compare=False, repr=False)


def text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@ENVS.register("openenv", schema=OpenEnvConfig, check=check_openenv)
class OpenEnvEnv(Env):
    """An OpenEnv environment: a task is a reset seed, an answer fills the Action's text field, the reward is the
    observation's; ``close`` ends a server's sessions."""

    def __init__(self, cfg: Any, seed: int = 0, sandbox: Any = None):
        super().__init__(cfg, seed, sandbox)
        self.backend = backend(cfg)
        self.policy = oracle_of(cfg)

    def make_task(self, seed: int) -> int:
        return seed

    def rules(self) -> str:
        return self.cfg.rules or self.backend.description

    def initial_state(self, task: int) -> OpenEnvState:
        first = self.backend.reset(task)
        return OpenEnvState(task, (), first.observation, first.reward, first.done, over=first.done, env=first.env)

    def observe(self, state: OpenEnvState) -> str:
        if self.cfg.observation_field:
            return text_of(state.observation.get(self.cfg.observation_field, ""))
        return "\n".join(f"{name}: {text_of(value)}" for name, value in state.observation.items())

    def step(self, state: OpenEnvState, action: str | None) -> Transition:
        """Send ``action`` to the environment; no answer, or one its Action refuses, is a format failure."""
        actions = state.actions + 1
        last = actions >= self.cfg.actions_per_episode
        result = None if action is None else self.backend.step(state, action)
        if result is None:
            new = replace(state, actions=actions, over=state.finished or last, solved=False)
            return Transition(new, self.cfg.format_penalty, new.over, False, False)
        over = result.done or last
        solved = over and result.reward >= self.cfg.success_reward
        new = OpenEnvState(state.seed, (*state.answers, action), result.observation, result.reward, result.done,
                           actions, over, solved, result.env)
        return Transition(new, result.reward, over, solved, True)

    def score(self, state: OpenEnvState) -> float:
        return float(state.solved)

    def oracle(self, state: OpenEnvState) -> str | None:
        """``env.oracle``'s answer to the latest observation (None without one, or when the episode is over)."""
        if self.policy is None or state.over:
            return None
        answer = self.policy(dict(state.observation))
        return None if answer is None else str(answer)

    def close(self) -> None:
        self.backend.close()
