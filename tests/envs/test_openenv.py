"""OpenEnv environments through marl's adapter, checked against the library itself: in-process, marl's reward,
end and observation equal the Environment's own on thousands of answers (right, wrong, malformed, none); served by
the library's own server and reached through its own client, everything equals in-process play on the same seeds,
branching included; bad settings fail in one line; a tiny run trains and evaluates on the shipped example."""

from __future__ import annotations

import contextlib
import itertools
import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from omegaconf import OmegaConf
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from marl_cli.config.errors import ConfigError
from marl_cli.envs.base import task_seed
from marl_cli.envs.openenv import OpenEnvConfig, OpenEnvEnv
from marl_cli.training.build import build_team
from marl_cli.training.loop import train
from tests.helpers import FAST, free_port, refusal, torch_threads, train_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openenv_envs" / "guess_number.py"
ENV = f"{EXAMPLE}:GuessNumberEnvironment"
sys.path.insert(0, str(EXAMPLE.parent))
from guess_number import GuessAction, GuessNumberEnvironment, GuessObservation  # noqa: E402

BASE = ["~experiment", "env=openenv", "workflow=single_agent", f"env.environment={ENV}", "workflow.max_turns=4"]
ANSWERS = ["0", "17", "-3", "100000", "abc", "3.5", "seven", "1 2", "+5", " 7 ", "08", "12abc", "½", "9" * 12]
"""Answers besides in-range guesses and the secret: out of range, or text the environment cannot read."""


def reference_text(observation: Observation) -> str:
    """The observation's public fields as marl shows them, computed from the library's object."""
    return "\n".join(f"{k}: {v}" for k, v in observation.model_dump(exclude={"reward", "done", "metadata"}).items())


def completion(rng: random.Random, secret: int) -> tuple[str, str | None]:
    """A model's text and the answer in it (None: no answer after the marker)."""
    kind = rng.random()
    if kind < 0.1:
        return rng.choice(["I think it is 7", "####", "#### ", "####\n  "]), None
    answer = str(secret) if kind < 0.3 else rng.choice(ANSWERS) if kind < 0.55 else str(rng.randint(1, 16))
    return f"let me guess.\n#### {answer}", answer.strip()


def test_rewards_ends_and_observations_equal_the_environments_own_in_process():
    workflow = build_team(train_config(*BASE))
    env, rng, pairs, failures = workflow.env, random.Random(0), 0, 0
    assert workflow.env.rules() == GuessNumberEnvironment().get_metadata().description
    for index in range(800):
        seed = task_seed("train", index, 0)
        ref = GuessNumberEnvironment()
        ref_obs = ref.reset(seed=seed)
        state = workflow.initial_state(env.task("train", index))
        actions = 0
        while not state.done:
            assert reference_text(ref_obs) in workflow.prompt("agent", state)
            workflow.act("agent", state, completion(rng, rng.randint(1, 16))[0])  # a sibling candidate first
            text, answer = completion(rng, ref.state.secret)
            out = workflow.act("agent", state, text)
            actions += 1
            pairs += 1
            if answer is None:
                failures += 1
                assert (out.local, out.format_ok, out.done) == (-1.0, False, actions == 4)
            else:
                ref_obs = ref.step(GuessAction(guess=answer))
                assert (out.local, out.format_ok) == (ref_obs.reward, True)
                assert out.done == (ref_obs.done or actions == 4)
                assert out.success == (out.done and ref_obs.reward >= 1.0) == (out.team == 1.0)
                assert env.observe(out.state.env) == reference_text(ref_obs)
            state = out.state
    assert pairs > 2000 and failures > 150


@contextlib.contextmanager
def serving(env_factory: Any, action: type, observation: type, sessions: int) -> Iterator[str]:
    """The library's own app for ``env_factory`` (``create_app``) under uvicorn on a free local port, in a thread."""
    app = create_app(env_factory, action, observation, max_concurrent_envs=sessions)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def adapter(**settings: Any) -> OpenEnvEnv:
    return OpenEnvEnv(OmegaConf.structured(OpenEnvConfig(actions_per_episode=4, **settings)))


@pytest.mark.parametrize("sessions", [1, 3])
def test_through_the_librarys_server_and_client_play_equals_in_process_play_branches_included(sessions):
    local = adapter(environment=ENV)
    with serving(GuessNumberEnvironment, GuessAction, GuessObservation, 4) as url:
        remote = adapter(base_url=url, sessions=sessions)
        assert remote.rules() == local.rules()
        rng, steps = random.Random(sessions), 0
        pairs = [(local.initial_state(s), remote.initial_state(s)) for s in range(1_000_000_000, 1_000_000_030)]
        for ours, theirs in pairs:
            assert local.observe(ours) == remote.observe(theirs)
        while pairs:
            ours, theirs = pairs.pop(rng.randrange(len(pairs)))  # episodes interleaved: sessions are reused
            for answer in [rng.choice([*ANSWERS, "8", "4", "12", None]) for _ in range(3)]:  # candidates
                a, b = local.step(ours, answer), remote.step(theirs, answer)
                assert (a.reward, a.done, a.success, a.format_ok) == (b.reward, b.done, b.success, b.format_ok)
                assert local.observe(a.state) == remote.observe(b.state)
                steps += 1
            if not a.done:
                pairs.append((a.state, b.state))
        assert steps >= 150 and len(remote.backend.live) <= sessions
        remote.close()


class Short(Action):
    guess: str = Field(max_length=2)


class ShortGuess(GuessNumberEnvironment):
    """Takes guesses of at most two characters: a longer one never reaches the game."""

    def step(self, action: Short, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        return super().step(GuessAction(guess=action.guess))


def test_an_answer_the_action_refuses_is_a_format_failure_in_process_and_through_the_server():
    local = adapter(environment=f"{__file__}:ShortGuess")
    with serving(ShortGuess, Short, GuessObservation, 1) as url:
        remote = adapter(base_url=url)
        for env in (local, remote):
            state = env.initial_state(7)
            refused = env.step(state, "123")
            assert (refused.reward, refused.format_ok, refused.state.answers) == (-1.0, False, ())
            taken = env.step(refused.state, "99")  # the session is where it was: the refusal never reached the game
            assert (taken.reward, taken.format_ok, env.observe(taken.state)) == (-0.5, True, local.observe(
                local.step(local.initial_state(7), "99").state))
        remote.close()


class CountObservation(Observation):
    count: int = 0


class CountAction(Action):
    text: str


class Drifting(Environment[CountAction, CountObservation, State]):
    """Not deterministic in its seed: each reset shows the next number of a counter shared by every instance."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    draws = itertools.count()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CountObservation:
        self.count = next(Drifting.draws)
        return CountObservation(count=self.count)

    def step(self, action: CountAction, timeout_s: float | None = None, **kwargs: Any) -> CountObservation:
        return CountObservation(count=self.count, reward=0.0)

    @property
    def state(self) -> State:
        return State()


def test_a_server_environment_that_replays_differently_or_refuses_sessions_fails_in_one_line():
    with serving(Drifting, CountAction, CountObservation, 1) as url:
        env = adapter(base_url=url)
        first = env.initial_state(0)
        env.initial_state(1)  # the one session moves to seed 1: seed 0 is replayed for the next step
        with pytest.raises(ConfigError, match="must be deterministic in its reset seed and the actions"):
            env.step(first, "go")
        env.close()
    with serving(Drifting, CountAction, CountObservation, 1) as url:
        crowded = adapter(base_url=url, sessions=2)
        crowded.initial_state(0)
        with pytest.raises(ConfigError, match="serve it with max_concurrent_envs >= env.sessions"):
            crowded.initial_state(1)
        crowded.close()


class Note(Action):
    guess: str
    remark: str = ""


class TwoTexts(GuessNumberEnvironment):
    def step(self, action: Note, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        return super().step(GuessAction(guess=action.guess))


class NoSeed(GuessNumberEnvironment):
    def reset(self) -> GuessObservation:  # type: ignore[override]
        return super().reset(seed=0)


@pytest.mark.parametrize(("overrides", "message"), [
    ([], "env=openenv takes one of env.environment (an Environment class"),
    (["env.environment=no_such_pkg.server:Env"], "env.environment=no_such_pkg.server:Env: cannot import "
                                                 "no_such_pkg.server"),
    ([f"env.environment={EXAMPLE}:Nope"], "module guess_number has no Nope"),
    (["env.environment=collections:OrderedDict"], "is not an OpenEnv Environment"),
    ([f"env.environment={ENV}", "env.action_field=answer"], "GuessAction has no such field; its fields: guess"),
    ([f"env.environment={__file__}:TwoTexts"], "Note has 2 text fields (guess, remark); name the one"),
    ([f"env.environment={__file__}:NoSeed"], "its reset takes no seed"),
    ([f"env.environment={ENV}", "env.observation_field=secret"], "env.observation_field=secret: the observation "
                                                                  "has no such public field; its fields: feedback"),
    ([f"env.environment={ENV}", "+env.action_extra.mood=1"], "env.action_extra names mood"),
    ([f"env.environment={ENV}", "+env.init.top=0"], "ValueError: top and max_guesses must be at least 1"),
    ([f"env.environment={ENV}", "env.oracle=guess_number:RULES"], "env.oracle=guess_number:RULES is not a function"),
    ([f"env.environment={ENV}", "env.base_url=http://127.0.0.1:8000"], "not both"),
    (["env.base_url=http://127.0.0.1:8000", "+env.init.top=3"], "env.init sets up an in-process environment"),
])
def test_bad_settings_fail_in_one_line(overrides, message):
    assert message in refusal(["~experiment", "env=openenv", "workflow=single_agent", *overrides])


def test_an_unreachable_server_fails_fast_and_a_missing_library_names_the_extra(monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    message = refusal(["~experiment", "env=openenv", f"env.base_url={url}"])
    assert message.startswith(f"env.base_url={url}: no OpenEnv server answers /schema there") and "start the " \
        "server" in message and time.monotonic() - start < 3
    assert TwoTexts and NoSeed  # also defined for the refusals above, which import this file by its path
    for name in [m for m in sys.modules if m == "openenv" or m.startswith("openenv.")]:
        monkeypatch.setitem(sys.modules, name, None)
    needs = "env=openenv needs openenv-core: pip install 'marl[openenv]'"
    assert refusal(["~experiment", "env=openenv", f"env.environment={ENV}"]) == needs
    assert refusal(["~experiment", "env=openenv", f"env.base_url={url}"]) == needs


def test_a_tiny_run_warm_starts_on_the_oracle_trains_and_evaluates(tmp_path):
    fast = [o for o in FAST if not o.startswith("env.")]
    cfg = train_config(*fast, *BASE[1:], "workflow.max_turns=2", "env.oracle=guess_number:midpoint",
                       "env.eval_size=2", "trainer.steps=1", "trainer.warmstart.enabled=true",
                       "trainer.warmstart.num_examples=8", "trainer.warmstart.epochs=1",
                       "trainer.warmstart.batch_size=8")
    with torch_threads(1):
        summary = train(cfg, tmp_path)
    assert (summary["status"], summary["steps"], summary["env"]) == ("completed", 1, "openenv")
    assert 0.0 <= summary["eval/success"] <= 1.0 and "eval/agent/format_failure" in summary
