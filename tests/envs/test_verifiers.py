"""verifiers environments through marl's adapter, checked against the library itself: the reward is the rubric's own
score on thousands of answers (right, wrong, malformed); a multi-turn and a tool environment play the same turns
through marl as through the library's own rollout loop (driven by a loopback OpenAI-compatible endpoint with a
script of replies); bad input is one line; a tiny run trains and evaluates on the shipped example environment."""

import asyncio
import json
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import verifiers as vf
from omegaconf import OmegaConf
from openai import AsyncOpenAI
from verifiers.utils.save_utils import state_to_output

from marl_cli.config.errors import ConfigError
from marl_cli.envs.verifiers import VerifiersConfig, VerifiersEnv
from marl_cli.training.loop import train
from tests.helpers import FAST, refusal, step_records, train_config

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples" / "verifiers_envs")
TOOL_ENV = '''
import verifiers as vf
from datasets import Dataset

def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b

def load_environment(max_turns: int = 4):
    rows = [{"question": f"Use the tool to add {a} and {b}.", "answer": str(a + b)} for a in range(9) for b in range(9)]
    parser = vf.XMLParser(["answer"])

    def correct_answer(completion, answer) -> float:
        return float(parser.parse_answer(completion) == answer)

    rubric = vf.Rubric(funcs=[correct_answer], parser=parser)
    return vf.ToolEnv(tools=[add], max_turns=max_turns, dataset=Dataset.from_list(rows[:60]),
                      eval_dataset=Dataset.from_list(rows[60:]), parser=parser, rubric=rubric)
'''


def env_of(env_id: str = "retry-arithmetic", path: str = EXAMPLES, turns: int = 3, **settings) -> VerifiersEnv:
    cfg = VerifiersConfig(env_id=env_id, path=path, actions_per_episode=turns, **{"eval_size": 20, **settings})
    return VerifiersEnv(OmegaConf.structured(cfg), seed=3)


class Endpoint:
    """A loopback OpenAI-compatible chat endpoint: a real HTTP server answering each request with ``reply(request)``
    (content, [(tool, arguments)]) and recording every request it got."""

    def __init__(self) -> None:
        self.reply = None
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                data = json.dumps(completion(body, *owner.reply(body))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def client(self) -> vf.Client:
        """The library's own chat-completions client, over the real OpenAI client, pointed at this endpoint."""
        url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        return vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=url, api_key="scripted", max_retries=0))


class ScriptedOpenAI:
    """An OpenAI-compatible client in this process, for thousands of rollouts: ``post`` (all the library's chat client
    calls) answers a chat request as ``Endpoint`` does, without the network."""

    base_url = "http://scripted.invalid/v1"

    def __init__(self, reply) -> None:
        self.reply = reply

    async def post(self, path: str, *, body: dict, cast_to: type, options: dict | None = None) -> httpx.Response:
        return httpx.Response(200, json=completion(body, *self.reply(body)))


def completion(body: dict, content: str | None, calls: list) -> dict:
    """A chat completion stating ``content`` and ``calls`` (ids as marl numbers them: call_<turn>_<i>)."""
    turn = sum(m["role"] == "assistant" for m in body["messages"])
    tool_calls = [{"id": f"call_{turn}_{i}", "type": "function",
                   "function": {"name": name, "arguments": json.dumps(arguments)}} for i, (name, arguments) in
                  enumerate(calls)]
    message = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if calls else {})}
    return {"id": "scripted", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}]}


def as_text(content: str | None, calls: list) -> str:
    """The reply as the model writes it for marl: its text, then a <tool_call> block per call."""
    blocks = [f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
              for name, arguments in calls]
    return "\n".join([content or "", *blocks]).strip()


# -- (a) the reward is the rubric's own score ----------------------------------------------------------------------

def answers_for(row: dict, rng: random.Random) -> list[str]:
    """Answers to one row: right, wrong and malformed ones."""
    gold, wrong = row["answer"], str(int(row["answer"]) + rng.choice([-10, -1, 1, 7]))
    return [f"<answer>{gold}</answer>", f"<answer> {gold} </answer>", f"I think <answer>{gold}</answer> is it",
            f"<answer>{wrong}</answer>", gold, f"<answer>{gold}", f"<answer></answer>{gold}", "</answer>",
            f"<answer>{wrong}</answer><answer>{gold}</answer>", rng.choice(["??", "42!", "<ans>1</ans>", "\u00e9"])]


def test_reward_is_the_rubrics_own_score_on_thousands_of_answers():
    env = env_of(env_args={"max_turns": 1}, turns=1)
    assert isinstance(env.env, vf.SingleTurnEnv)
    rng = random.Random(0)
    pairs = [(row, answer) for row in (env.task("train", i) for i in range(200)) for answer in answers_for(row, rng)]
    answers = iter(answer for _, answer in pairs)
    client = vf.OpenAIChatCompletionsClient(ScriptedOpenAI(lambda body: (next(answers), [])))

    async def library() -> list[dict]:
        return [await env.env.run_rollout(row, client, "scripted", {}) for row, _ in pairs]

    wrong = malformed = 0
    for (row, answer), output in zip(pairs, asyncio.run(library()), strict=True):
        t = env.step(env.initial_state(row), answer)
        assert t.done and t.reward == output["reward"], answer  # exactly: the library's own sum
        assert {k.removeprefix("rubric/"): v for k, v in t.info.items() if k.startswith("rubric/")} == \
            output["metrics"]
        assert t.success == (output["reward"] >= env.env.pass_threshold)
        assert env.score(t.state) == (1.0 if t.success else pytest.approx(output["reward"] / 1.2))
        wrong += output["metrics"]["correct_answer"] == 0.0
        malformed += "<answer>" not in answer or "</answer>" not in answer
    assert len(pairs) == 2000 and wrong > 1000 and malformed > 700
    assert env.step(env.initial_state(pairs[0][0]), None).reward == env.cfg.format_penalty


def test_splits_never_share_a_prompt():
    for env in (env_of(), env_of(eval_split="train", eval_size=50)):
        train = {json.dumps(row["prompt"]) for row in env.train_rows}
        evals = {json.dumps(env.task("eval", i)["prompt"]) for i in range(env.cfg.eval_size)}
        assert not train & evals and len(evals) == env.cfg.eval_size
    assert len(env.train_rows) == 1950 and env.task("eval", 0) == env.env.get_dataset()[1950]


# -- (b) the same turns as the library's own rollout loop ----------------------------------------------------------

def play_both(env: VerifiersEnv, rows: list[dict], scripts: list[list[tuple]]) -> None:
    """Each row played by the library's own loop (``run_rollout`` over the loopback endpoint) and by marl with the
    same replies: the same prompt at every turn, the same replies used, messages, stop, reward and scores."""
    endpoint = Endpoint()
    client = endpoint.client()
    theirs, seen = [], []
    for row, script in zip(rows, scripts, strict=True):
        replies = iter(script)
        endpoint.reply = lambda body, replies=replies: next(replies)
        before = len(endpoint.requests)
        theirs.append(asyncio.run(env.env.run_rollout(row, client, "scripted", {})))
        seen.append([r["messages"] for r in endpoint.requests[before:]])
    endpoint.server.shutdown()
    for row, script, output, requests in zip(rows, scripts, theirs, seen, strict=True):
        state, prompts = env.initial_state(row), []
        for content, calls in script[:len(requests)]:
            prompts.append(asyncio.run(client.to_native_prompt(list(state.prompt)))[0])
            t = env.step(state, as_text(content, calls))
            state = t.state
        assert prompts == requests and state.done
        ours = state_to_output(state.rollout)  # the library's own record of a rollout, for both
        for key in ("prompt", "completion", "answer", "stop_condition", "is_completed", "is_truncated", "error",
                    "tool_defs"):
            assert ours[key] == output[key], key
        assert t.reward == t.info["rubric"] == output["reward"]
        assert {k.removeprefix("rubric/"): v for k, v in t.info.items() if k.startswith("rubric/")} == \
            output["metrics"]


def test_a_multi_turn_env_plays_the_same_turns_as_the_librarys_loop():
    env, rng = env_of(turns=3, demo="<answer>{answer}</answer>"), random.Random(1)
    rows = [env.task("train", i) for i in range(24)]
    kinds = [lambda a: f"<answer>{a}</answer>", lambda a: f"<answer>{int(a) + 1}</answer>", lambda a: a,
             lambda a: "no idea", lambda a: f"<answer>{a}"]
    scripts = [[(rng.choice(kinds)(row["answer"]), []) for _ in range(3)] for row in rows]
    play_both(env, rows, scripts)
    start = env.initial_state(rows[0])  # candidates branch from one state, which stays as it was
    wrong, right = env.step(start, "<answer>-1</answer>"), env.step(start, env.oracle(start))
    assert env.oracle(start) == f"<answer>{rows[0]['answer']}</answer>" and env.oracle(right.state) is None
    assert not wrong.done and right.done and right.success and env.score(right.state) == 1.0
    assert start.rollout["trajectory"] == [] and env.observe(wrong.state).endswith("User: Incorrect, try again.")
    assert env.step(wrong.state, "<answer>-2</answer>").state.rollout["trajectory"][0]["completion"][0].content == \
        "<answer>-1</answer>"


def test_a_tool_env_calls_its_tools_as_under_the_library(tmp_path):
    (tmp_path / "vf_add_tool.py").write_text(TOOL_ENV)
    env, rng = env_of("vf-add-tool", path=str(tmp_path), turns=4), random.Random(2)
    rows = [env.task("train", i) for i in range(12)]
    scripts = []
    for row in rows:
        a, b = (int(n) for n in row["question"].removeprefix("Use the tool to add ").rstrip(".").split(" and "))
        call = rng.choice([[("add", {"a": a, "b": b})], [("add", {"a": a})], [("mul", {"a": a, "b": b})],
                           [("add", {"a": a, "b": b}), ("add", {"a": b, "b": a})]])
        scripts.append([(rng.choice([None, "Let me add."]), call), (f"<answer>{rng.choice([a + b, a])}</answer>", [])])
    play_both(env, rows, scripts)
    shown = env.observe(env.initial_state(rows[0]))
    assert shown.startswith("Tools: call one with <tool_call>") and "- add(a: integer, b: integer)" in shown


# -- (c) bad input ---------------------------------------------------------------------------------------------------

NO_LOADER = "import verifiers as vf\n"
GROUP_RUBRIC = '''
import verifiers as vf
from datasets import Dataset

def load_environment():
    def judge(completions, answers) -> list[float]:
        return [0.0] * len(completions)
    return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "1+1", "answer": "2"}]),
                            rubric=vf.Rubric(funcs=[judge]))
'''


@pytest.mark.parametrize("overrides, message", [
    (["env.env_id=no-such-env"], "env.env_id=no-such-env: no verifiers environment no_such_env is installed or in "
                                 "env.path=" + EXAMPLES),
    (["env.env_id=retry-arithmatic"], "similar: retry-arithmetic"),
    (["+env.env_args.colour=red"], "env.env_args: retry-arithmetic's load_environment takes no colour; it takes: "
                                   "max_turns, num_train, num_eval, max_operand, terms, seed"),
    (["+env.env_args.max_turns=0"], "env.env_id=retry-arithmetic: verifiers cannot load it with env.env_args="
                                    "{'max_turns': 0} (ValueError: max_turns must be at least 1, got 0)"),
    (["+env.env_args.max_operand=3", "+env.env_args.num_train=100"], "ValueError: only 16 distinct sums"),
    (["env.path=nowhere"], "env.path=nowhere: no such folder"),
    (["env.success_reward=2"], "env.success_reward=2.0 is above the rubric's highest reward 1.2"),
    (["env.reward_range=[1,1]"], "set env.reward_range=[lo,hi] with lo < hi"),
    (["env.eval_split=train", "env.eval_size=2000"], "env.eval_size=2000: the dataset of retry-arithmetic has 2000 "
                                                     "rows, which training and evaluation share; lower env.eval_size"),
])
def test_bad_verifiers_setups_fail_in_one_line(overrides, message):
    assert message in refusal(["env=verifiers", "workflow=single_agent", f"env.path={EXAMPLES}", *overrides])


@pytest.mark.parametrize("source, message", [
    (NO_LOADER, "(AttributeError: Module 'vf_bad' does not expose load_environment.)"),
    (GROUP_RUBRIC, "env.env_id=vf-bad: its rubric has group reward functions"),
])
def test_envs_marl_cannot_drive_fail_in_one_line(tmp_path, source, message):
    (tmp_path / "vf_bad.py").write_text(source)
    sys.modules.pop("vf_bad", None)
    assert message in refusal(["env=verifiers", "workflow=single_agent", "env.env_id=vf-bad", f"env.path={tmp_path}"])


def test_without_verifiers_the_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)
    assert refusal(["env=verifiers", "workflow=single_agent"]) == \
        "env=verifiers needs verifiers: pip install 'marl[verifiers]'"


# -- (d) a tiny run --------------------------------------------------------------------------------------------------

def test_a_verifiers_run_trains_and_evaluates(tmp_path):
    """No answer marker: the whole reply goes to the env, so the untrained model's replies reach it (its second turns,
    its rubric)."""
    fast = [o for o in FAST if not o.startswith("env.")]
    summary = train(train_config(*fast, "env=verifiers", f"env.path={EXAMPLES}", "env.eval_size=4",
                                 "workflow=single_agent", "workflow.max_turns=2", "workflow.answer_marker=''",
                                 "trainer.steps=2"), tmp_path)
    assert summary["status"] == "completed" and 0.0 <= summary["eval/success"] <= 1.0
    steps = step_records(tmp_path)
    assert len(steps) == 2 and any(r["train/agent/format_failure"] < 1 and r["train/turns"] > 1 for r in steps)


ASKS_THE_MODEL = '''
import verifiers as vf
from datasets import Dataset

class Asks(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        response = await self.get_model_response(state, messages)
        return [vf.UserMessage(content=str(response.message.content))]

def load_environment():
    rows = [{"question": f"hello {i}", "answer": "x"} for i in range(4)]
    return Asks(max_turns=3, dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
'''


def test_an_env_asking_the_model_itself_stops_in_one_line(tmp_path):
    (tmp_path / "vf_asks.py").write_text(ASKS_THE_MODEL)
    env = env_of("vf-asks", path=str(tmp_path), eval_split="train", eval_size=1)
    with pytest.raises(ConfigError, match=r"^env.env_id=vf-asks asked the rollout's model for a reply of its own "
                                          r"\(APIConnectionError: Connection error.\); marl generates only the "
                                          r"policy's replies$"):
        env.step(env.initial_state(env.task("train", 0)), "hello")
