"""A Redis client that fails on some buckets' keys, for tests of what one bucket's failure does
to the others.

It wraps a real client and passes through the few commands ``BucketIndex`` uses (scripts,
pipelines, SET, HGET, HSET). A bucket is *down* (every command on its keys fails, as on a shard
that does not answer) or *refuses writes* (reads and read-only scripts answer, anything that
writes fails: a shard out of memory under ``noeviction``, or a replica not yet promoted). In a
pipeline a failing command answers its error in its place, as redis-py's pipelines do with
``raise_on_error=False``; with ``unreachable`` the whole server is gone and every call raises
``ConnectionError`` (a failover of a non-cluster Redis).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import redis
from redis.exceptions import ConnectionError, OutOfMemoryError

import timers.engine

How = Literal["down", "refuses writes"]
LUA = Path(timers.engine.__file__).parent / "lua"
READ_ONLY_SCRIPTS = {"check", "bulk"}  # bulk: the prelude of every script, never run alone
WRITING = {"SET", "HSET", "HDEL", "ZADD", "ZREM", "DEL", "PEXPIRE", "FLUSHALL"}
TAG = re.compile(r"\{b(\d+)\}")


def _sha(name: str) -> str:
    text = (LUA / "bulk.lua").read_text() + (LUA / f"{name}.lua").read_text()  # as Script
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


WRITING_SHAS = {_sha(p.stem) for p in LUA.glob("*.lua") if p.stem not in READ_ONLY_SCRIPTS}


class SickRedis:
    def __init__(self, real: redis.Redis, sick: dict[int, How] | None = None) -> None:
        self.real = real
        self.sick: dict[int, How] = dict(sick or {})
        self.unreachable = False
        self.refused: list[tuple[int, str]] = []  # (bucket, command) of each failed command

    # ---------------------------------------------------------------- deciding

    def refusal(self, args: Sequence[Any]) -> Exception | None:
        """The error this command meets, or None if it goes through."""
        if self.unreachable:
            raise ConnectionError("Error 111 connecting to redis: Connection refused.")
        name = str(args[0]).upper()
        if name in ("EVALSHA", "EVAL"):
            keys = [str(k) for k in args[3 : 3 + int(args[2])]]
            writes = name == "EVAL" or str(args[1]) in WRITING_SHAS
        else:
            keys = [str(args[1])] if len(args) > 1 else []
            writes = name in WRITING
        for key in keys:
            found = TAG.search(key)
            how = self.sick.get(int(found.group(1))) if found else None
            if how == "down":
                self.refused.append((int(found.group(1)), name) if found else (-1, name))
                return ConnectionError(f"Timeout reading from {key}'s shard")
            if how == "refuses writes" and writes:
                self.refused.append((int(found.group(1)), name) if found else (-1, name))
                return OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
        return None

    def _call(self, args: Sequence[Any], go: Callable[[], Any]) -> Any:
        error = self.refusal(args)
        if error is not None:
            raise error
        return go()

    # ---------------------------------------------------------------- what BucketIndex uses

    def register_script(self, text: str) -> Any:
        script = self.real.register_script(text)

        def run(keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None) -> Any:
            call = ("EVALSHA", script.sha, len(keys), *keys, *args)
            return self._call(call, lambda: script(keys=keys, args=args))

        return run

    def pipeline(self, transaction: bool = True) -> SickPipeline:
        return SickPipeline(self, self.real.pipeline(transaction=transaction))

    def set(self, name: str, value: str, *, px: int | None = None, nx: bool = False) -> Any:
        return self._call(("SET", name), lambda: self.real.set(name, value, px=px, nx=nx))

    def get(self, name: str) -> Any:
        return self._call(("GET", name), lambda: self.real.get(name))

    def hget(self, name: str, key: str) -> Any:
        return self._call(("HGET", name), lambda: self.real.hget(name, key))

    def hset(self, name: str, key: str, value: str) -> Any:
        return self._call(("HSET", name), lambda: self.real.hset(name, key, value))


class SickPipeline:
    def __init__(self, sick: SickRedis, real: Any) -> None:
        self.sick, self.real = sick, real
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any) -> SickPipeline:
        self.commands.append(args)
        return self

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        results: list[Any] = [None] * len(self.commands)
        sent: list[int] = []
        for i, args in enumerate(self.commands):
            error = self.sick.refusal(args)
            if error is None:
                self.real.execute_command(*args)
                sent.append(i)
            else:
                results[i] = error
        got = self.real.execute(raise_on_error=False) if sent else []
        for i, result in zip(sent, got, strict=True):
            results[i] = result
        self.commands = []
        errors = [r for r in results if isinstance(r, Exception)]
        if errors and raise_on_error:
            raise errors[0]
        return results
