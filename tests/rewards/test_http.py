"""The OpenAI-compatible judge against a stub server on the loopback address: its answers, and its faults."""

from __future__ import annotations

import time

import pytest

from marl_cli.rewards.base import Judged
from marl_cli.rewards.http import HttpJudge, JudgeCallError
from tests.helpers import FAST, refusal, train_config
from tests.rewards.stub_judge import StubJudge

ITEM = Judged("agent", "Go from S to G.", "#### RR", "RR")


def grade(prompt: str) -> str:
    return "Looks right.\nScore: 8" if "Answer given: RR" in prompt else "Score: 2"


def judge(url: str, *overrides: str) -> HttpJudge:
    cfg = train_config(*FAST, "reward=http", f"reward.url={url}", "reward.roles=[agent]", "reward.backoff_s=0.01",
                       *overrides)
    return HttpJudge(cfg, None)


def test_the_judge_sends_the_rubric_and_parses_the_reply():
    with StubJudge(grade) as stub:
        verdicts = judge(stub.url, "reward.model=grader").score([ITEM, Judged("agent", "p", "#### U", "U")])
    assert [(v.score, v.failure, v.tokens) for v in verdicts] == [(0.8, "", 7), (0.2, "", 7)]
    sent = next(r for r in stub.requests if "Answer given: RR" in r["messages"][0]["content"])  # sent concurrently
    assert sent["model"] == "grader" and sent["temperature"] == 0.0 and sent["max_tokens"] == 64
    assert "Score: <0-10>" in sent["messages"][0]["content"]


def test_the_api_key_comes_from_the_environment_only(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    with StubJudge(grade) as stub:
        judge(stub.url, "reward.api_key_env=MY_JUDGE_KEY").score([ITEM])
        judge(stub.url, "reward.api_key_env=UNSET_JUDGE_KEY_VAR").score([ITEM])
    assert [r["authorization"] for r in stub.requests] == ["Bearer sk-test", None]


def test_a_rate_limit_is_waited_out_as_retry_after_says():
    with StubJudge(grade, [("status", 429, {"Retry-After": "0.3"}), ("status", 503)]) as stub:
        t0 = time.perf_counter()
        verdict, = judge(stub.url).score([ITEM])
        waited = time.perf_counter() - t0
    assert verdict.score == 0.8 and len(stub.requests) == 3
    assert waited >= 0.3 + 0.02  # Retry-After, then backoff_s · 2^1


def test_a_server_that_keeps_failing_is_a_counted_fallback_after_the_retries():
    with StubJudge(grade, [("status", 500)] * 4) as stub:
        verdict, = judge(stub.url, "reward.retries=3").score([ITEM])
    assert (verdict.score, verdict.failure) == (None, "error") and len(stub.requests) == 4


def test_a_client_error_is_not_retried():
    with StubJudge(grade, [("status", 400)]) as stub:
        verdict, = judge(stub.url).score([ITEM])
    assert verdict.failure == "error" and len(stub.requests) == 1


@pytest.mark.parametrize("fault", [("garbage",), ("empty",)])
def test_a_malformed_answer_is_retried(fault):
    with StubJudge(grade, [fault]) as stub:
        verdict, = judge(stub.url).score([ITEM])
    assert verdict.score == 0.8 and len(stub.requests) == 2


def test_a_call_that_times_out_is_retried():
    with StubJudge(grade, [("sleep", 1.0)]) as stub:
        verdict, = judge(stub.url, "reward.timeout_s=0.2").score([ITEM])
    assert verdict.score == 0.8 and len(stub.requests) == 2


def test_on_error_raise_stops_with_one_line():
    with (StubJudge(grade, [("status", 502)] * 2) as stub,
          pytest.raises(JudgeCallError, match=r"failed 2 times; last: HTTP 502") as caught):
        judge(stub.url, "reward.retries=1", "reward.on_error=raise").score([ITEM])
    assert "\n" not in str(caught.value)


def test_a_down_server_fails_every_call_and_is_counted():
    with StubJudge(grade) as stub:
        url = stub.url
        live = judge(url, "reward.retries=1")
    verdicts = live.score([ITEM, ITEM])
    assert [v.failure for v in verdicts] == ["error", "error"]


def test_many_prompts_go_out_concurrently():
    with StubJudge(grade, [("sleep", 0.5)] * 4) as stub:
        verdicts = judge(stub.url, "reward.concurrency=3").score([ITEM] * 4)
    assert [v.score for v in verdicts] == [0.8] * 4 and 2 <= stub.most_in_flight <= 3  # at most the concurrency


def test_an_unreachable_judge_url_is_refused_at_start():
    with StubJudge(grade) as stub:
        url = stub.url  # the port is free again once the stub stops
    message = refusal([*FAST, "reward=http", f"reward.url={url}", "reward.roles=[agent]"])
    assert message.startswith(f"reward.url={url}: no judge answers there")
