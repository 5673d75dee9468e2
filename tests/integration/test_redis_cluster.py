"""The local Redis Cluster (ops.redis_cluster) is a real one: redis-py's RedisCluster, built as
the functions build theirs, works across its slots and survives what the fixture does to it.

The cluster is the session's (3 masters + 3 replicas); each test that hurts it leaves it
settled, and no test assumes which port is a master.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import AskError, MovedError, TryAgainError

from ops.redis_cluster import SLOTS, LocalRedisCluster, parse_nodes, slot_ranges
from tests.support.real_parts import RedisTarget

pytestmark = [pytest.mark.integration, pytest.mark.real_parts]

SCRIPT = """
-- KEYS[1] a counter, KEYS[2] a log, both under one hash tag: one slot
local n = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return n
"""


@pytest.fixture
def cluster(redis_cluster: LocalRedisCluster) -> Iterator[LocalRedisCluster]:
    redis_cluster.flush_all()
    yield redis_cluster
    redis_cluster.fail_back()  # nodes a test killed back, its first masters masters again


@pytest.fixture
def client(cluster: LocalRedisCluster) -> Iterator[Any]:
    conn = RedisTarget(cluster.url, cluster=True).client()
    yield conn
    conn.close()


def asking(port: int, *command: str) -> Any:
    """``command`` after ASKING on one connection, as a client follows an ASK redirection."""
    conn = redis.Connection(port=port, decode_responses=True)
    try:
        conn.send_command("ASKING")
        assert conn.read_response() == "OK"
        conn.send_command(*command)
        return conn.read_response()
    finally:
        conn.disconnect()


def tags_on_every_master(cluster: LocalRedisCluster, per_master: int = 2) -> list[str]:
    """Hash tags whose slots fall on each master in turn."""
    wanted = {port: per_master for port in cluster.masters()}
    tags = []
    for i in range(10_000):
        owner = cluster.owner(cluster.slot_of(f"{{b{i}}}"))
        if wanted.get(owner):
            wanted[owner] -= 1
            tags.append(f"{{b{i}}}")
        if not any(wanted.values()):
            return tags
    raise AssertionError(f"no tags for {wanted}")


def test_it_starts_as_three_masters_with_a_replica_each(cluster: LocalRedisCluster) -> None:
    masters = cluster.masters()
    assert masters == cluster.ports[:3]  # masters first, slots in order
    assert [len(cluster.replicas_of(m)) for m in masters] == [1, 1, 1]
    views = cluster.view()
    assert sorted((v.slots for v in views if v.slots), key=str) == sorted(
        (((low, high),) for low, high in slot_ranges(3)), key=str
    )
    assert cluster.unsettled() is None


def test_set_get_across_every_slot_owner(cluster: LocalRedisCluster, client: Any) -> None:
    keys = [f"key:{i}" for i in range(300)]
    for i, key in enumerate(keys):
        client.set(key, i)
    assert {cluster.owner(cluster.slot_of(k)) for k in keys} == set(cluster.masters())
    assert [int(client.get(k)) for k in keys] == list(range(300))
    assert sum(cluster.nodes[m].client.dbsize() for m in cluster.masters()) == 300


def test_a_lua_script_runs_on_each_slots_master_and_cross_slot_is_refused(
    cluster: LocalRedisCluster, client: Any
) -> None:
    script = client.register_script(SCRIPT)
    for tag in tags_on_every_master(cluster):
        assert script(keys=[f"n:{tag}", f"log:{tag}"], args=["a"]) == 1
        assert script(keys=[f"n:{tag}", f"log:{tag}"], args=["b"]) == 2
        assert client.lrange(f"log:{tag}", 0, -1) == ["a", "b"]
    first, other = tags_on_every_master(cluster, 1)[:2]
    with pytest.raises(redis.RedisClusterException, match="same key slot"):
        script(keys=[f"n:{first}", f"log:{other}"], args=["c"])  # redis-py refuses it first
    node = cluster.nodes[cluster.owner(cluster.slot_of(first))].client
    with pytest.raises(redis.ResponseError, match="don't hash to the same slot"):  # the server
        node.eval(SCRIPT, 2, f"n:{first}", f"log:{other}", "c")


def test_pipelines_span_the_masters(cluster: LocalRedisCluster, client: Any) -> None:
    tags = tags_on_every_master(cluster)
    pipe = client.pipeline(transaction=False)
    for tag in tags:
        pipe.zadd(f"due:{tag}", {"m1": 1, "m2": 2})
        pipe.zrangebyscore(f"due:{tag}", 0, 1)
    results = pipe.execute()
    assert results == [2, ["m1"]] * len(tags)
    with client.pipeline(transaction=True) as multi:  # MULTI: one slot per transaction
        multi.incr(f"n:{tags[0]}")
        multi.incr(f"m:{tags[0]}")
        assert multi.execute() == [1, 1]


def test_a_killed_master_is_replaced_by_its_replica_and_rejoins_as_one(
    cluster: LocalRedisCluster, client: Any
) -> None:
    keys = [f"survivor:{i}" for i in range(100)]
    for key in keys:
        client.set(key, key)
    victim = cluster.owner(cluster.slot_of(keys[0]))
    replica = cluster.replicas_of(victim)[0]
    for node in cluster.nodes.values():  # what the replica has is what survives
        if node.port == victim:
            node.client.execute_command("WAIT", 1, 5000)

    promoted = cluster.kill_master(victim)

    assert promoted == replica
    assert cluster.owner(cluster.slot_of(keys[0])) == promoted
    assert [client.get(k) for k in keys] == keys  # redis-py found the new owner
    client.set(keys[0], "after")
    cluster.restart(victim)
    assert cluster.replicas_of(promoted) == [victim]
    assert client.get(keys[0]) == "after"


def test_a_slot_held_mid_migration_answers_ask_and_tryagain_then_moved(
    cluster: LocalRedisCluster, client: Any
) -> None:
    tag = tags_on_every_master(cluster, 1)[0]
    slot = cluster.slot_of(tag)
    source = cluster.owner(slot)
    target = next(m for m in cluster.masters() if m != source)
    keys = [f"k{i}:{tag}" for i in range(10)]
    for key in keys:
        client.set(key, key)
    raw = cluster.nodes[source].client

    with cluster.migrating(slot, target) as migration:
        assert migration.move_keys(5) == 5
        kept = migration.keys_left()
        moved = [k for k in keys if k not in kept]
        assert len(moved) == 5
        with pytest.raises(AskError, match=f"^{slot} 127.0.0.1:{target}$"):
            raw.get(moved[0])
        with pytest.raises(AskError):  # a multi-key command missing keys is sent on...
            raw.mget(moved[0], kept[0])
        with pytest.raises(TryAgainError):  # ...where it cannot run until the keys are together
            asking(cluster.nodes[target].port, "MGET", moved[0], kept[0])
        assert [client.get(k) for k in keys] == keys  # the cluster client follows ASK

    assert cluster.owner(slot) == target
    with pytest.raises(MovedError, match=f"^{slot} 127.0.0.1:{target}$"):
        raw.get(keys[0])
    assert client.mget(keys) == keys
    cluster.migrate_slots([slot], source)  # put it back: the next test sees the start layout
    assert cluster.owner(slot) == source


def test_a_lost_shard_comes_back_empty_serving_the_same_slots(
    cluster: LocalRedisCluster, client: Any
) -> None:
    tags = tags_on_every_master(cluster, 1)
    for tag in tags:
        client.set(f"x:{tag}", "1")
    victim = cluster.owner(cluster.slot_of(tags[0]))
    slots_before = {v.port: v.slots for v in cluster.view() if v.slots}

    cluster.lose_shard(victim)

    assert {v.port: v.slots for v in cluster.view() if v.slots} == slots_before
    assert client.get(f"x:{tags[0]}") is None
    assert [client.get(f"x:{t}") for t in tags[1:]] == ["1", "1"]
    assert len(cluster.replicas_of(victim)) == 1


def test_flushes(cluster: LocalRedisCluster, client: Any) -> None:
    tags = tags_on_every_master(cluster, 1)
    for tag in tags:
        client.set(f"f:{tag}", "1")
    cluster.flush_shard(cluster.owner(cluster.slot_of(tags[0])))
    assert [client.get(f"f:{t}") for t in tags] == [None, "1", "1"]
    cluster.flush_all()
    assert [cluster.nodes[port].client.dbsize() for port in cluster.ports] == [0] * 6


def test_cluster_nodes_lines_are_read_with_their_slots_and_migrations() -> None:
    text = (
        "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5 7 [8->-b2] [9-<-b2]\n"
        "b2 127.0.0.1:7001@17001 slave,fail a1 0 0 1 disconnected\n"
    )
    master, replica = parse_nodes(text)
    assert (master.port, master.is_master, master.slots) == (7000, True, ((0, 5), (7, 7)))
    assert (replica.master_id, replica.failing, replica.connected) == ("a1", True, False)
    assert slot_ranges(3)[-1] == (10922, SLOTS - 1)
