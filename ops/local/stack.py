"""The whole service on one machine: ``python -m ops.local`` (``make run``).

Starts, in order: a redis-server (or, with ``REDIS_SHARDS=N``, a Redis Cluster of N masters and
N replicas), a moto server with the template's tables and queues (with ``DYNAMODB=local``, the
tables on Amazon's DynamoDB Local), a sandbox pool per template function, the HTTP gateway (Api
routes + Lambda Invoke), the demo tenant, then the template's schedules. Prints the ready lines
and runs until Ctrl-C. Anything that fails - a busy port, a missing piece, a component that
dies - stops everything with one line naming the cause and a non-zero exit; a Redis Cluster
node that dies is the exception: its replica takes over and the stack starts it again as a
replica, as ElastiCache replaces a failed node.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.config import Config

from ops import admin, template
from ops.dynamodb_local import DynamoDBLocal, MissingDependency, find_jar, find_java
from ops.local import state
from ops.local.gateway import Gateway
from ops.local.lambdas import IDLE_S, FunctionPool, sandbox_env
from ops.local.queues import QueuePoller
from ops.local.schedules import Scheduler, scheduled_event
from ops.local.spec import ScheduleSpec, StackSpec, TemplateError, load_stack
from ops.offline import LOCAL_CREDENTIALS
from ops.ports import port_is_free
from ops.redis_cluster import BUS_OFFSET, MAX_SHARDS, MIN_SHARDS, ClusterError, LocalRedisCluster
from ops.redis_server import RedisServer, find_redis_server
from timers.core.numbers import is_ascii_digits

DEMO_TENANT = "demo"
DEFAULT_DYNAMODB = "moto"  # docs/local-stack.md: DYNAMODB=local costs Java, memory and start time
START_TIMEOUT_S = 60.0
WATCH_INTERVAL_S = 0.2


class StackError(Exception):
    """Why the stack cannot start or had to stop, in one line."""


@dataclass(frozen=True)
class LocalConfig:
    api_port: int = 3000
    aws_port: int = 4566
    redis_port: int = 6390
    redis_shards: int = 1  # 1: one plain redis-server; 3..8: a cluster of masters + replicas
    dynamodb: str = DEFAULT_DYNAMODB  # or "local": Amazon's DynamoDB Local
    dynamodb_port: int = 8000  # DynamoDB Local's (with DYNAMODB=local)
    demo_api_key: str | None = None
    concurrency: int = 8  # sandboxes per function: armed trigger runs wait for their due instant
    idle_s: int = int(IDLE_S)  # an idle sandbox is retired after this, as Lambda does

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LocalConfig:
        def number(name: str, default: int, low: int = 1, high: int = 65535) -> int:
            raw = env.get(name) or str(default)
            if not is_ascii_digits(raw) or not low <= int(raw) <= high:
                raise StackError(f"{name}={raw!r} is not a number from {low} to {high}")
            return int(raw)

        shards = env.get("REDIS_SHARDS") or "1"
        if shards != "1" and not (
            is_ascii_digits(shards) and MIN_SHARDS <= int(shards) <= MAX_SHARDS
        ):
            raise StackError(
                f"REDIS_SHARDS={shards!r} is not 1 (one redis-server) or a cluster of "
                f"{MIN_SHARDS} to {MAX_SHARDS} masters"
            )
        dynamodb = env.get("DYNAMODB") or DEFAULT_DYNAMODB
        if dynamodb not in ("local", "moto"):
            raise StackError(f"DYNAMODB={dynamodb!r} is not local (DynamoDB Local) or moto")
        config = cls(
            api_port=number("API_PORT", 3000),
            aws_port=number("AWS_PORT", 4566),
            redis_port=number("REDIS_PORT", 6390),
            redis_shards=int(shards),
            dynamodb=dynamodb,
            dynamodb_port=number("DYNAMODB_PORT", 8000),
            demo_api_key=env.get("TIMERS_DEMO_API_KEY") or None,
            concurrency=number("LOCAL_LAMBDA_CONCURRENCY", 8, high=64),
            idle_s=number("LOCAL_LAMBDA_IDLE_S", int(IDLE_S), high=86_400),
        )
        seen: dict[int, str] = {}
        for port, name in config.ports():
            if port in seen:
                raise StackError(f"{seen[port]} and {name} are the same port, {port}")
            seen[port] = name
        if config.cluster and max(config.redis_ports) + BUS_OFFSET > 65535:
            raise StackError(
                f"REDIS_PORT={config.redis_port}: a cluster's bus ports (+{BUS_OFFSET}) "
                "must stay below 65536"
            )
        return config

    @property
    def cluster(self) -> bool:
        return self.redis_shards > 1

    @property
    def redis_ports(self) -> range:
        """REDIS_PORT, or a cluster's REDIS_PORT .. REDIS_PORT+2N-1 (masters first)."""
        return range(
            self.redis_port, self.redis_port + (2 * self.redis_shards if self.cluster else 1)
        )

    def ports(self) -> Iterator[tuple[int, str]]:
        """Every port the stack listens on, with the setting that names it."""
        yield self.api_port, "API_PORT"
        yield self.aws_port, "AWS_PORT"
        for port in self.redis_ports:
            offset = port - self.redis_port
            name = f"REDIS_PORT+{offset}" if offset else "REDIS_PORT"
            yield port, name
            if self.cluster:
                yield port + BUS_OFFSET, f"the cluster bus of {name}"
        if self.dynamodb == "local":
            yield self.dynamodb_port, "DYNAMODB_PORT"

    @property
    def aws_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.aws_port}"

    @property
    def dynamodb_endpoint(self) -> str:
        port = self.dynamodb_port if self.dynamodb == "local" else self.aws_port
        return f"http://127.0.0.1:{port}"

    @property
    def api_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"


def require_free(ports: Iterator[tuple[int, str]]) -> None:
    """Every port free, else one line: which is taken, and - when it is a killed stack's
    leftover process that holds it - what to kill."""
    for port, name in ports:
        if port_is_free(port):
            continue
        if left := state.leftovers():
            pids = " ".join(map(str, left))
            what = ", ".join(f"{pid} {program}" for pid, program in left.items())
            raise StackError(
                f"port {port} ({name}) is held by what a local stack that was killed left "
                f"running ({what}): kill {pids}, then start again"
            )
        raise StackError(f"port {port} ({name}) is already in use")


class LocalStack:
    def __init__(self, config: LocalConfig, say: Callable[[str], None]) -> None:
        self.config = config
        self.say = say
        self.logs = state.state_dir() / "logs"
        self.redis: RedisServer | None = None
        self.cluster: LocalRedisCluster | None = None
        self.repairs: dict[int, threading.Thread] = {}  # cluster node port -> its replacement
        self.repair_failed: str | None = None
        self.dynamodb: DynamoDBLocal | None = None
        self.moto: subprocess.Popen[bytes] | None = None
        self.lock = state.Lock()
        self._starting: ThreadPoolExecutor | None = None  # Ctrl-C may come while they start
        self.pools: dict[str, FunctionPool] = {}
        self.gateway: Gateway | None = None
        self.gateway_thread: threading.Thread | None = None
        self.scheduler: Scheduler | None = None
        self.poller: QueuePoller | None = None
        self.demo: dict[str, Any] = {}
        self._aws = boto3.Session()

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        c = self.config
        try:
            self.lock.acquire()  # before anything in the state directory is touched
        except state.StateDirBusy as exc:
            raise StackError(str(exc)) from None
        require_free(c.ports())
        if c.dynamodb == "local":
            try:
                find_java(), find_jar()
            except MissingDependency as exc:
                raise StackError(f"missing dependency: {exc}") from None
        spec = self._read_template()
        # This process talks to moto too (tables, the demo tenant), in the stack's region.
        os.environ.pop("AWS_ENDPOINT_URL_DYNAMODB", None)  # a shell's own: not ours to follow
        os.environ.update(AWS_DEFAULT_REGION=spec.region, **self._aws_endpoints())
        for name, value in LOCAL_CREDENTIALS.items():
            os.environ.setdefault(name, value)  # botocore insists; moto ignores them
        self._aws = boto3.Session()
        self.logs.mkdir(parents=True, exist_ok=True)
        for old in self.logs.glob("*.log"):
            old.unlink()
        self._start_stores(spec)
        self._start_functions(spec)
        try:
            self.gateway = Gateway(c.api_port, spec, self.pools, self.say)
        except OSError as exc:
            raise StackError(f"port {c.api_port} (API_PORT): {exc.strerror}") from None
        self.gateway_thread = self.gateway.serve_in_background()
        self.demo = self._ensure_demo_tenant()
        self.poller = QueuePoller(
            spec.queue_sources,
            self._aws.client("sqs", endpoint_url=c.aws_endpoint),
            self.pools,
            spec.region,
            c.concurrency,
            self.say,
        )
        self.poller.start()
        self.scheduler = Scheduler(spec.schedules, self._fire_schedule(spec))
        self.scheduler.start()
        state.write(
            {
                "pid": os.getpid(),
                "api_url": f"{c.api_endpoint}/v1",
                "aws_endpoint": c.aws_endpoint,
                "dynamodb_endpoint": c.dynamodb_endpoint,
                "redis_url": c.redis_url,
                "redis_cluster": c.cluster,
                "demo": self.demo,
            }
        )

    def _start_stores(self, spec: StackSpec) -> None:
        """Redis, moto and DynamoDB Local side by side: each waits on its own process (the
        JVM's start is the longest), so together they take the longest one's time."""
        starts = [self._start_redis, lambda: self._start_moto(spec)]
        if self.config.dynamodb == "local":
            starts.append(self._start_dynamodb)
        self._starting = ThreadPoolExecutor(len(starts))
        done = [self._starting.submit(start) for start in starts]
        self._starting.shutdown(wait=True)
        self._record_children()
        for future in done:  # the first failure in start order; the rest stop with the stack
            if error := future.exception():
                raise error

    def _aws_endpoints(self) -> dict[str, str]:
        """Where AWS is, for this process and every sandbox: moto, DynamoDB maybe elsewhere
        (botocore and pynamodb read AWS_ENDPOINT_URL_DYNAMODB before AWS_ENDPOINT_URL)."""
        endpoints = {"AWS_ENDPOINT_URL": self.config.aws_endpoint}
        if self.config.dynamodb == "local":
            endpoints["AWS_ENDPOINT_URL_DYNAMODB"] = self.config.dynamodb_endpoint
        return endpoints

    def _record_children(self) -> None:
        """What would outlive a ``kill -9`` of this process (started in sessions of their own),
        so the next start can name it."""
        children: dict[int, str] = {}
        if self.redis and self.redis.process:
            children[self.redis.process.pid] = f"redis-server :{self.config.redis_port}"
        if self.cluster:
            for port, node in self.cluster.nodes.items():
                if node.process and node.alive:
                    children[node.process.pid] = f"redis-server :{port}"
        if self.moto:
            children[self.moto.pid] = "ops.local.moto_server"
        if self.dynamodb:
            children[self.dynamodb.process.pid] = "DynamoDBLocal.jar"
        state.record_children(os.getpid(), children)

    def ready_lines(self) -> list[str]:
        return [
            f"API: {self.config.api_endpoint}/v1",
            f"Console: {self.config.api_endpoint}/v1/console",
            f"AWS endpoint: {self.config.aws_endpoint}",
            f"DynamoDB endpoint: {self.config.dynamodb_endpoint}",
            f"Redis: {self.config.redis_url}{self._redis_shape()}",
            f"Tenant demo API key: {self.demo['api_key']}",
            f"Tenant demo callback queue: {self.demo['callback_queue_url']}",
        ]

    def _redis_shape(self) -> str:
        c = self.config
        if not c.cluster:
            return ""
        ports = f"{c.redis_ports[0]}-{c.redis_ports[-1]}"
        return f" (cluster: {c.redis_shards} masters + {c.redis_shards} replicas on {ports})"

    def _runtime_env(self) -> dict[str, str]:
        """What every sandbox gets besides its template environment: where AWS is."""
        return {
            **self._aws_endpoints(),
            "AWS_ENDPOINT_URL_LAMBDA": self.config.api_endpoint,
            "AWS_SAM_LOCAL": "true",  # as `sam local` sets it: powertools skips X-Ray
            "TIMERS_LOCAL_STACK": "true",  # errors may name this stack's settings
            **LOCAL_CREDENTIALS,
            # Loopback webhook targets (tests, make demo): only if the stack was started with it.
            **{k: v for k, v in os.environ.items() if k == "TIMERS_ALLOW_LOOPBACK_TARGETS"},
        }

    def _read_template(self) -> StackSpec:
        # ElastiCache's stand-in: a plain redis-server, or a cluster the functions use as one.
        endpoints = {
            "REDIS_URL": self.config.redis_url,
            "REDIS_CLUSTER": "true" if self.config.cluster else "false",
        }
        try:
            return load_stack(
                endpoints,
                aws_endpoint=self.config.aws_endpoint,
                concurrency=self.config.concurrency,
            )
        except (TemplateError, OSError) as exc:
            raise StackError(f"template.yaml: {exc}") from None

    def _start_redis(self) -> None:
        try:
            binary = find_redis_server()
        except FileNotFoundError as exc:
            raise StackError(f"missing dependency: {exc}") from None
        c = self.config
        try:
            if c.cluster:
                self.cluster = LocalRedisCluster.start(
                    c.redis_shards, c.redis_port, binary=binary, new_session=True, log_dir=self.logs
                )
            else:
                self.redis = RedisServer.start(binary, port=c.redis_port, new_session=True)
        except (RuntimeError, TimeoutError, OSError, ClusterError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            what = "the Redis Cluster" if c.cluster else "redis-server"
            raise StackError(f"{what} failed to start: {first}") from None

    def _start_dynamodb(self) -> None:
        try:
            self.dynamodb = DynamoDBLocal.start(
                self.config.dynamodb_port, log=self.logs / "dynamodb-local.log", new_session=True
            )
        except (RuntimeError, TimeoutError, OSError) as exc:
            raise StackError(f"DynamoDB Local failed to start: {exc}") from None

    def _start_moto(self, spec: StackSpec) -> None:
        for module in ("moto.server", "flask", "flask_cors"):
            if importlib.util.find_spec(module) is None:
                raise StackError(
                    f"missing dependency: {module} (pip install 'moto[server]'; make run does)"
                )
        log = (self.logs / "moto.log").open("ab")
        self.moto = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ops.local.moto_server",  # moto.server, with four of its costs taken out
                "-H",
                "127.0.0.1",
                "-p",
                str(self.config.aws_port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches only us; we stop it in order
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(self.config.aws_port):
            if self.moto.poll() is not None:
                raise StackError(f"moto server exited at start (code {self.moto.returncode})")
            if time.monotonic() > deadline:
                raise StackError(f"moto server not answering after {START_TIMEOUT_S:.0f}s")
            time.sleep(0.05)
        config = Config(retries={"max_attempts": 10, "mode": "standard"})
        endpoint = self.config.aws_endpoint
        if self.config.dynamodb == "moto":  # else DynamoDB Local creates them
            dynamodb = self._aws.client("dynamodb", endpoint_url=endpoint, config=config)
            template.create_tables(dynamodb)
        template.create_queues(self._aws.client("sqs", endpoint_url=endpoint, config=config))

    def _start_functions(self, spec: StackSpec) -> None:
        runtime = self._runtime_env()
        for name, function in spec.functions.items():
            env = sandbox_env(function, spec.region, runtime)
            sandboxes = min(self.config.concurrency, function.reserved or self.config.concurrency)
            self.pools[name] = FunctionPool(
                function, env, self.logs, sandboxes, self.say, self.config.idle_s
            )
        with ThreadPoolExecutor(len(self.pools) or 1) as warmers:
            warmed = warmers.map(FunctionPool.warm, self.pools.values())
            failures = dict(zip(self.pools, warmed, strict=True))
        for name, failure in failures.items():
            if failure is not None:
                error = failure.error()
                raise StackError(f"{name} failed to start: {error['errorMessage']}")

    def _ensure_demo_tenant(self) -> dict[str, Any]:
        sqs = self._aws.client("sqs", endpoint_url=self.config.aws_endpoint)
        target = admin.Target(admin.LOCAL_SETTINGS, sqs)
        try:
            return admin.create_tenant(target, DEMO_TENANT, self.config.demo_api_key)
        except Exception as exc:
            message = getattr(exc, "message", None) or str(exc)
            raise StackError(f"demo tenant: {message}") from None

    def _fire_schedule(self, spec: StackSpec) -> Callable[[ScheduleSpec, float], None]:
        def fire(schedule: ScheduleSpec, at: float) -> None:
            self.pools[schedule.function].invoke_async(scheduled_event(schedule, spec.region, at))

        return fire

    # ------------------------------------------------------------------ run, stop
    def watch(self, stop: threading.Event) -> str | None:
        """Block until ``stop`` is set (None) or a component dies (the reason)."""
        while not stop.wait(WATCH_INTERVAL_S):
            for pool in self.pools.values():
                pool.retire_idle()
            if self.redis and self.redis.process and self.redis.process.poll() is not None:
                return f"redis-server exited (code {self.redis.process.returncode})"
            if self.cluster and (reason := self._watch_cluster()):
                return reason
            if self.dynamodb and self.dynamodb.process.poll() is not None:
                return f"DynamoDB Local exited (code {self.dynamodb.process.returncode})"
            if self.moto and self.moto.poll() is not None:
                return f"moto server exited (code {self.moto.returncode})"
            if self.gateway_thread and not self.gateway_thread.is_alive():
                return "the HTTP gateway stopped"
            if self.scheduler and not self.scheduler.thread.is_alive():
                return "the scheduler stopped"
            if self.poller and not self.poller.alive():
                return "an SQS event source poller stopped"
        return None

    def _watch_cluster(self) -> str | None:
        """A dead node is no crash: its replica takes over (Redis does that), then the stack
        starts the node again and it rejoins as a replica, as ElastiCache replaces a failed
        node. The stack stops only when that cannot happen (a shard with no node left)."""
        assert self.cluster is not None
        if self.repair_failed:
            return f"the Redis Cluster did not recover: {self.repair_failed}"
        for port in self.cluster.dead_ports():
            if port in self.repairs and self.repairs[port].is_alive():
                continue
            node = self.cluster.nodes[port]
            code = node.process.returncode if node.process else None
            self.say(f"redis node 127.0.0.1:{port} exited (code {code}): replacing it")
            repair = threading.Thread(target=self._replace_node, args=(port,), daemon=True)
            self.repairs[port] = repair
            repair.start()
        return None

    def _replace_node(self, port: int) -> None:
        assert self.cluster is not None
        try:
            self.cluster.replace(port)
        except ClusterError as exc:
            if not self.cluster.stopped:
                self.repair_failed = str(exc)
            return
        self._record_children()
        self.say(
            f"redis node 127.0.0.1:{port} is back, a replica; masters {self.cluster.masters()}"
        )

    def stop(self) -> None:
        """Stop everything this stack started, in reverse order. Safe at any point; a part
        that fails to stop is logged and never keeps the others running. The state files are
        removed only by the stack that holds the state directory's lock: its own."""
        if self._starting:  # what is starting has started before it is stopped
            self._starting.shutdown(wait=True)
        steps: list[Callable[[], None]] = [state.remove] if self.lock.held else []
        if self.scheduler:
            steps.append(self.scheduler.stop)
        if self.poller:
            steps.append(self.poller.stop)
        if self.gateway:
            steps += [self.gateway.shutdown, self.gateway.server_close]
        steps += [pool.close for pool in self.pools.values()]
        steps += [self._stop_moto, self.redis.stop if self.redis else (lambda: None)]
        if self.dynamodb:
            steps.append(self.dynamodb.stop)
        if self.cluster:
            steps.append(self.cluster.stop)
        steps.append(self.lock.release)
        for step in steps:
            try:
                step()
            except Exception:  # keep stopping the rest
                with (self.logs / "stop-errors.log").open("a") as log:
                    log.write(traceback.format_exc())

    def _stop_moto(self) -> None:
        if self.moto and self.moto.poll() is None:
            self.moto.terminate()
            try:
                self.moto.wait(3)
            except subprocess.TimeoutExpired:
                self.moto.kill()
                self.moto.wait(5)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def main() -> int:
    stop = threading.Event()

    def say(line: str) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
        print(f"{stamp} {line}", flush=True)

    stack: LocalStack | None = None
    reason: str | None = None
    try:
        stack = LocalStack(LocalConfig.from_env(os.environ), say)
        stack.start()
        for line in stack.ready_lines():
            print(line, flush=True)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        reason = stack.watch(stop)
    except StackError as exc:
        reason = str(exc)
    except KeyboardInterrupt:  # Ctrl-C while starting
        reason = None
    except Exception as exc:
        state.state_dir().mkdir(parents=True, exist_ok=True)
        (state.state_dir() / "crash.log").write_text(traceback.format_exc())
        reason = f"crashed: {type(exc).__name__}: {exc} (traceback in .local/crash.log)"
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop
        if stack is not None:
            stack.stop()
    if reason:
        print(f"local stack stopped: {reason}", file=sys.stderr, flush=True)
        return 1
    print("local stack stopped", flush=True)
    return 0
