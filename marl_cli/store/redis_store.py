"""The networked store: a Redis server that trainers on several machines share.

Layout under ``marl:<namespace>:`` (each name part percent-encoded, so a ``:`` inside a name cannot
make two keys collide): per stream a hash ``items:<stream>`` (key → JSON), a list ``order:<stream>``
(keys in first-write order) and per consumer a set ``acked:<stream>:<consumer>``; per record a string
``record:<name>``. Writes and acknowledgements run as Lua scripts, which Redis executes atomically, so the
"write each key once" rule holds when writers race; a read is one transaction plus one ``HMGET``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from marl_cli.config.errors import ConfigError
from marl_cli.store.base import Store

# KEYS: items hash, order list[, record key]; ARGV: record JSON (or ""), then key, value, key, value, ...
_PUT_MANY = """
local written = 0
for i = 2, #ARGV, 2 do
    if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
        redis.call('RPUSH', KEYS[2], ARGV[i])
        written = written + 1
    end
end
if KEYS[3] then
    redis.call('SET', KEYS[3], ARGV[1])
end
return written
"""

# KEYS: items hash, acked set; ARGV: keys to acknowledge (those the stream does not hold are ignored).
_ACK = """
local acked = 0
for i = 1, #ARGV do
    if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
        acked = acked + redis.call('SADD', KEYS[2], ARGV[i])
    end
end
return acked
"""


def _part(name: str) -> str:
    return quote(name, safe="")


class RedisStore(Store):
    """A store on the Redis server at ``host:port``; the connection is checked at construction.

    Args:
        namespace: prefix separating this run's streams and records from others on the same server.
        host, port, db: where the server is and which logical database to use.
        password: the server's password; empty when it has none.
        connect_timeout_s: how long to try reaching the server before giving up.

    Raises:
        ConfigError: the ``redis`` package is missing, or the server cannot be reached or refuses the password.
    """

    def __init__(
        self,
        namespace: str,
        host: str = "localhost",
        port: int = 6379,
        password: str = "",
        db: int = 0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            raise ConfigError("store=redis needs the redis package: pip install 'marl[redis]'") from exc
        self.namespace = namespace
        self.location = f"Redis server {host}:{port} db {db}"
        self._prefix = f"marl:{_part(namespace)}:"
        settings = {
            "host": host,
            "port": port,
            "db": db,
            "password": password or None,
            "decode_responses": True,
            "socket_connect_timeout": connect_timeout_s,
        }
        # Check the address and password once, without the client's retries (which would only delay the error);
        # the client kept for the run does retry, to ride out short network blips.
        probe = redis.Redis(**settings, retry=Retry(NoBackoff(), 0))
        try:
            probe.ping()
        except redis.RedisError as exc:
            reason = " ".join(str(exc).split())
            if isinstance(exc, redis.AuthenticationError):
                raise ConfigError(
                    f"the redis store at {host}:{port} refused the login ({reason}); check store.password"
                ) from exc
            raise ConfigError(
                f"cannot reach the redis store at {host}:{port} ({reason}); start redis-server or set store.host/port"
            ) from exc
        finally:
            probe.close()
        self._client: Any = redis.Redis(**settings)
        self._put_many = self._client.register_script(_PUT_MANY)
        self._ack = self._client.register_script(_ACK)

    def _items(self, stream: str) -> str:
        return f"{self._prefix}items:{_part(stream)}"

    def _order(self, stream: str) -> str:
        return f"{self._prefix}order:{_part(stream)}"

    def _acked(self, stream: str, consumer: str) -> str:
        return f"{self._prefix}acked:{_part(stream)}:{_part(consumer)}"

    def _record(self, name: str) -> str:
        return f"{self._prefix}record:{_part(name)}"

    def put_many(self, stream: str, items: dict[str, dict], record: tuple[str, dict] | None = None) -> int:
        keys = [self._items(stream), self._order(stream)]
        args = [""]
        if record is not None:
            keys.append(self._record(record[0]))
            args = [json.dumps(record[1])]
        for key, value in items.items():
            args += [key, json.dumps(value)]
        return int(self._put_many(keys=keys, args=args))

    def read(self, stream: str, consumer: str) -> list[tuple[str, dict]]:
        pipe = self._client.pipeline(transaction=True)
        pipe.lrange(self._order(stream), 0, -1)
        pipe.smembers(self._acked(stream, consumer))
        order, done = pipe.execute()
        todo = [key for key in order if key not in done]
        if not todo:
            return []
        values = self._client.hmget(self._items(stream), todo)
        return [(key, json.loads(value)) for key, value in zip(todo, values, strict=True)]

    def ack(self, stream: str, consumer: str, keys: Iterable[str] | None = None) -> int:
        args = self._client.lrange(self._order(stream), 0, -1) if keys is None else list(keys)
        if not args:
            return 0
        return int(self._ack(keys=[self._items(stream), self._acked(stream, consumer)], args=args))

    def acked(self, stream: str, consumer: str) -> int:
        return int(self._client.scard(self._acked(stream, consumer)))

    def count(self, stream: str) -> int:
        return int(self._client.llen(self._order(stream)))

    def set(self, name: str, value: dict) -> None:
        self._client.set(self._record(name), json.dumps(value))

    def get(self, name: str) -> dict | None:
        value = self._client.get(self._record(name))
        return None if value is None else json.loads(value)

    def close(self) -> None:
        self._client.close()
