"""``reward=http``: a judge served behind an OpenAI-compatible API (vLLM's, SGLang's, llama.cpp's, a provider's).

Each rubric prompt is one ``POST {url}/chat/completions`` (``model``, one user message, ``temperature``,
``max_tokens``), ``reward.concurrency`` of them at a time. A call that times out, cannot connect, or is answered
429 (rate limited) or 5xx is tried again up to ``reward.retries`` times, waiting ``backoff_s · 2^attempt`` seconds
(or the server's ``Retry-After``, at most ``reward.max_wait_s``); another 4xx is not retried. A call that still
fails is counted (``judge/errors``) and scores ``reward.invalid`` (``on_error=fallback``), or stops the run with
one line (``on_error=raise``). Before the run builds a model, ``GET {url}/models`` checks that something answers
at ``reward.url`` (any HTTP answer will do); nothing there is a one-line error. The API key is read from the
environment variable ``reward.api_key_env`` (never from the config, which is saved with the run).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from marl_cli.config.errors import ConfigError, RunError
from marl_cli.config.schema import bounded, choices
from marl_cli.rewards.base import REWARDS
from marl_cli.rewards.rubric import RubricConfig, RubricJudge, check_rubric

OnError = choices("OnError", "fallback", "raise", module=__name__)
RETRIED = (429, 500, 502, 503, 504)
"""The answers a call is tried again after: rate limited, or the server's own trouble."""


@dataclass
class HttpJudgeConfig(RubricConfig):
    """A judge behind an OpenAI-compatible chat-completions API (``reward=http``)."""

    url: str = "http://127.0.0.1:8000/v1"  # the API's base URL (…/v1)
    model: str = "judge"  # the served model's name
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding the key (unset: no key sent)
    temperature: float = bounded(0.0, ge=0.0)  # 0: greedy
    max_tokens: int = bounded(64, ge=1)  # the judge's reply
    timeout_s: float = bounded(30.0, gt=0.0)  # per call
    retries: int = bounded(3, ge=0)  # tries after the first, on a timeout, no connection, 429 or 5xx
    backoff_s: float = bounded(1.0, ge=0.0)  # the wait before retry n is backoff_s · 2^n (or Retry-After)
    max_wait_s: float = bounded(60.0, ge=0.0)  # the longest wait between tries, whatever Retry-After says
    concurrency: int = bounded(8, ge=1)  # calls in flight at once
    on_error: OnError = OnError.fallback  # a call that still fails: score it `invalid` (counted), or stop the run
    probe: bool = True  # check at start that something answers at `url`


class JudgeCallError(RunError):
    """A judge call that failed after its retries (``on_error=raise``): the run stops with one line saying what
    happened (exit 1; its checkpoints and metrics stand)."""


def check_http(cfg: Any) -> None:
    """The rubric, and something answers at ``reward.url`` (when ``reward.probe``)."""
    check_rubric(cfg)
    reward = cfg.reward
    if not str(reward.url).startswith(("http://", "https://")):
        raise ConfigError(f"reward.url={reward.url!r} is not an http(s) URL")
    if reward.probe:
        reachable(reward.url, min(reward.timeout_s, 5.0))


def reachable(url: str, timeout: float) -> None:
    """Something answers HTTP at ``url`` (``GET {url}/models``; any status will do); a one-line error if not."""
    try:
        urllib.request.urlopen(f"{url.rstrip('/')}/models", timeout=timeout).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(f"reward.url={url}: no judge answers there ({reason}); start the server, or fix the "
                          "URL") from None


@REWARDS.register("http", schema=HttpJudgeConfig, check=check_http)
class HttpJudge(RubricJudge):
    """Replies from an OpenAI-compatible server, several calls at a time, each retried as the module says."""

    def __init__(self, cfg: Any, run: Any):
        super().__init__(cfg, run)
        self.reward = cfg.reward
        self.endpoint = f"{str(self.reward.url).rstrip('/')}/chat/completions"
        key = os.environ.get(self.reward.api_key_env, "")
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}

    def replies(self, prompts: list[str]) -> list[tuple[str | None, int]]:
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.reward.concurrency, len(prompts))) as pool:
            return list(pool.map(self.reply, prompts))

    def reply(self, prompt: str) -> tuple[str | None, int]:
        """The judge's reply to one prompt and its tokens (the server's ``usage``), after retries; (None, 0) when
        every try failed and ``on_error=fallback``."""
        body = json.dumps({"model": self.reward.model, "messages": [{"role": "user", "content": prompt}],
                           "temperature": self.reward.temperature, "max_tokens": self.reward.max_tokens}).encode()
        last = ""
        for attempt in range(self.reward.retries + 1):
            try:
                return self._call(body)
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code} {exc.reason}"
                if exc.code not in RETRIED:
                    break
                wait = _retry_after(exc)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
                wait = None
            if attempt < self.reward.retries:
                time.sleep(min(self.reward.max_wait_s, self.reward.backoff_s * 2 ** attempt if wait is None else wait))
        if self.reward.on_error == "raise":
            raise JudgeCallError(f"the judge at {self.endpoint} failed {self.reward.retries + 1} times; last: {last} "
                                 "(reward.on_error=fallback scores such calls reward.invalid instead)")
        return None, 0

    def _call(self, body: bytes) -> tuple[str, int]:
        request = urllib.request.Request(self.endpoint, data=body, headers=self.headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.reward.timeout_s) as answer:
            data = json.loads(answer.read())
        try:
            text = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"the answer holds no choices[0].message.content: {str(data)[:120]}") from exc
        return str(text or ""), int((data.get("usage") or {}).get("total_tokens", 0))


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    """The server's ``Retry-After`` in seconds (None: none, or not a number)."""
    value = exc.headers.get("Retry-After") if exc.headers else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
