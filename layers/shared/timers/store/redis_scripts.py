"""What the Redis code shares: the commands it uses, Lua scripts registered once, replies read
as text."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol


class RedisPort(Protocol):
    """The commands used; ``redis.Redis`` and ``redis.RedisCluster`` fit."""

    def register_script(self, script: str) -> Any: ...
    def pipeline(self, transaction: bool = True) -> Any: ...
    def get(self, name: str) -> Any: ...
    def hget(self, name: str, key: str) -> Any: ...
    def hset(self, name: str, key: str, value: str) -> Any: ...


class Script:
    """A Lua file of ``folder`` after its shared ``prelude``, registered once (EVALSHA, loading
    it on NOSCRIPT)."""

    def __init__(self, client: RedisPort, folder: Path, name: str, prelude: str) -> None:
        text = (folder / f"{prelude}.lua").read_text() + (folder / f"{name}.lua").read_text()
        self.run = client.register_script(text)
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def as_text(value: Any) -> str:
    """A reply as text (redis-py answers bytes unless it decodes)."""
    return value.decode() if isinstance(value, bytes) else str(value)
