"""A local OpenAI-compatible judge server for the tests: on the loopback address, each POST answered as the next
entry of its script says (then as its default), every request recorded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = Callable[[str], str]
"""The judge's reply text to a rubric prompt."""


class StubJudge:
    """``with StubJudge(reply) as judge:`` serves ``judge.url`` (…/v1) until the block ends.

    ``script`` entries, used once each in order before the default (``reply``): ``("status", code, headers)``,
    ``("sleep", seconds)`` (then the default answer), ``("garbage",)`` (a body that is not JSON), ``("empty",)``
    (JSON without choices).
    """

    def __init__(self, reply: Reply, script: list[tuple[Any, ...]] | None = None):
        self.reply = reply
        self.script = list(script or [])
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        """The most POSTs the server was answering at once."""
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> StubJudge:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _next(self, body: dict[str, Any]) -> tuple[Any, ...]:
        with self.lock:
            self.requests.append(body)
            return self.script.pop(0) if self.script else ("ok",)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(200, json.dumps({"data": [{"id": "judge"}]}).encode())

            def do_POST(self) -> None:
                with stub.lock:
                    stub.in_flight += 1
                    stub.most_in_flight = max(stub.most_in_flight, stub.in_flight)
                try:
                    self._answer()
                finally:
                    with stub.lock:
                        stub.in_flight -= 1

            def _answer(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body["authorization"] = self.headers.get("Authorization")
                action = stub._next(body)
                if action[0] == "status":
                    self._send(action[1], b"{}", action[2] if len(action) > 2 else None)
                    return
                if action[0] == "garbage":
                    self._send(200, b"<html>not json")
                    return
                if action[0] == "empty":
                    self._send(200, b"{}")
                    return
                if action[0] == "sleep":
                    time.sleep(action[1])
                text = stub.reply(body["messages"][0]["content"])
                answer = {"choices": [{"message": {"role": "assistant", "content": text}}],
                          "usage": {"total_tokens": 7}}
                self._send(200, json.dumps(answer).encode())

        return Handler
