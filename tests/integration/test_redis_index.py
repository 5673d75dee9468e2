"""RedisIndex and Lock against a real redis-server: the lease protocol's guarantees."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import redis
from redis.crc import key_slot

from timers.redis_index import (
    ADD_CHUNK,
    Leased,
    Lock,
    RedisIndex,
    bucket_of,
    member,
    parse_member,
)

pytestmark = pytest.mark.integration

NOW = 1_700_000_000_000  # a fixed "now" in epoch ms: time is always an argument
LEASE_MS = 30_000


@pytest.fixture
def index(redis_client: redis.Redis) -> RedisIndex:
    return RedisIndex(redis_client, bucket_count=1)


def items(n: int, due_ms: int = NOW, tenant: str = "t1") -> list[tuple[str, str, int]]:
    return [(tenant, f"timer-{i:05d}", due_ms) for i in range(n)]


def members_of(its: list[tuple[str, str, int]]) -> set[str]:
    return {member(*it) for it in its}


# --- pure helpers ---------------------------------------------------------------------------


def test_member_round_trips_and_timer_ids_may_contain_the_separator() -> None:
    assert member("acme", "tm-1", NOW) == f"acme|tm-1|{NOW}"
    assert parse_member(member("acme", "a|b", NOW)) == ("acme", "a|b", NOW)
    with pytest.raises(ValueError):
        member("ac|me", "tm-1", NOW)


def test_bucket_of_is_stable_across_processes_and_in_range() -> None:
    assert bucket_of("abc", 1 << 32) == 0x352441C2  # crc32("abc"), not the salted hash()
    assert bucket_of("abc", 1000) == 0x352441C2 % 1000
    assert {bucket_of(f"tm-{i}", 16) for i in range(1000)} == set(range(16))


# --- add ------------------------------------------------------------------------------------


def test_add_is_idempotent(index: RedisIndex) -> None:
    its = items(3)
    assert index.add(its) == 3
    assert index.add(its) == 0
    assert index.add(its + items(1, NOW + 1, tenant="t2")) == 1
    assert index.size(0) == (4, 0)


def test_add_skips_members_in_flight(index: RedisIndex) -> None:
    index.add(items(2))
    leased = index.lease(0, NOW, LEASE_MS, 10, "A")
    assert index.add(items(2)) == 0  # the migrator re-adding must not hand them to trigger B
    assert index.size(0) == (0, 2)
    assert index.lease(0, NOW, LEASE_MS, 10, "B").members == []
    assert index.ack(0, "A", leased.members) == 2
    assert index.add(items(2)) == 2  # acked: a later re-add is a fresh schedule


def test_add_places_members_by_stable_bucket_in_one_round_trip(
    counting_client: redis.Redis,
) -> None:
    index = RedisIndex(counting_client, bucket_count=16)
    its = items(200)
    counting_client.script_flush()
    CountingConnection.sent = 0
    assert index.add(its[:100]) == 100
    # cold cache: the pipeline meets NOSCRIPT (1), one call loads the script (EVALSHA, SCRIPT
    # LOAD, EVALSHA: 3), the other buckets go in one pipeline again (1)
    assert CountingConnection.sent == 5
    CountingConnection.sent = 0
    assert index.add(its) == 100
    assert CountingConnection.sent == 1  # warm: every bucket in one pipeline
    for tenant, timer_id, due_ms in its:
        assert (
            counting_client.zscore(
                index.keys(bucket_of(timer_id, 16)).due, member(tenant, timer_id, due_ms)
            )
            == due_ms
        )


def test_add_chunks_a_big_batch_and_keeps_every_member(index: RedisIndex) -> None:
    n = ADD_CHUNK * 2 + 7
    assert index.add(items(n)) == n
    assert index.size(0) == (n, 0)


# --- lease ----------------------------------------------------------------------------------


def test_lease_takes_only_due_members_oldest_first_within_limit(index: RedisIndex) -> None:
    index.add([("t", "late", NOW), ("t", "early", NOW - 5_000), ("t", "mid", NOW - 10)])
    index.add([("t", "future", NOW + 1)])

    first = index.lease(0, NOW, LEASE_MS, 2, "A")
    assert first.members == [member("t", "early", NOW - 5_000), member("t", "mid", NOW - 10)]
    assert first.reclaimed == 0
    second = index.lease(0, NOW, LEASE_MS, 10, "A")
    assert second.members == [member("t", "late", NOW)]  # due exactly now counts as due
    assert index.lease(0, NOW, LEASE_MS, 10, "A").members == []  # never early
    assert index.next_due(0) == NOW + 1
    assert index.lease(0, NOW + 1, LEASE_MS, 10, "A").members == [member("t", "future", NOW + 1)]


def test_lease_with_limit_zero_only_reclaims(index: RedisIndex) -> None:
    index.add(items(2))
    index.lease(0, NOW, 1_000, 10, "A")
    got = index.lease(0, NOW + 1_000, LEASE_MS, 0, "B")
    assert (got.members, got.reclaimed) == ([], 2)
    assert index.size(0) == (2, 0)


def test_lease_answers_str_members_with_either_client_decoding(
    redis_url: str, redis_client: redis.Redis
) -> None:
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        index = RedisIndex(client, bucket_count=1)
        index.add(items(1))
        assert index.lease(0, NOW, LEASE_MS, 10, "A").members == [member(*items(1)[0])]


def test_interleaved_leasers_get_disjoint_slices_covering_every_due_member(
    index: RedisIndex,
) -> None:
    due = items(25)
    index.add(due + items(5, NOW + 60_000, tenant="later"))
    got: dict[str, list[str]] = {"A": [], "B": []}
    while True:
        a = index.lease(0, NOW, LEASE_MS, 3, "A").members
        b = index.lease(0, NOW, LEASE_MS, 4, "B").members
        if not a and not b:
            break
        got["A"] += a
        got["B"] += b
    assert not set(got["A"]) & set(got["B"])
    assert sorted(got["A"] + got["B"]) == sorted(members_of(due))


def test_concurrent_leasers_split_a_big_bucket_exactly(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    due = items(2_000)
    index.add(due)
    threads = 8
    start = threading.Barrier(threads)
    got: list[list[str]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        start.wait()
        while batch := index.lease(0, NOW, LEASE_MS, 37, f"owner-{t}").members:
            got[t] += batch

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()

    everyone = [m for batch in got for m in batch]
    assert len(everyone) == len(set(everyone)) == 2_000  # pairwise disjoint
    assert set(everyone) == members_of(due)
    owners = redis_client.hgetall(index.keys(0).owner)
    for t, batch in enumerate(got):
        assert {owners[m.encode()] for m in batch} <= {f"owner-{t}".encode()}
    assert index.size(0) == (0, 2_000)


# --- expiry, ack, extend, release -----------------------------------------------------------


def test_expired_lease_is_reclaimed_and_only_the_new_owner_can_ack(index: RedisIndex) -> None:
    index.add(items(1))
    (m,) = index.lease(0, NOW, 1_000, 10, "A").members

    assert index.lease(0, NOW + 999, LEASE_MS, 10, "B").members == []  # still A's
    again = index.lease(0, NOW + 1_000, LEASE_MS, 10, "B")
    assert (again.members, again.reclaimed) == ([m], 1)
    assert index.ack(0, "A", [m]) == 0  # A was too slow: the member is B's now
    assert index.size(0) == (0, 1)
    assert index.ack(0, "B", [m]) == 1
    assert index.size(0) == (0, 0)
    assert index.ack(0, "B", [m]) == 0


def test_reclaimed_member_keeps_its_due_score(index: RedisIndex) -> None:
    index.add([("t", "x", NOW - 7)])
    index.lease(0, NOW, 1_000, 10, "A")
    assert index.lease(0, NOW + 1_000, LEASE_MS, 0, "B").reclaimed == 1
    assert index.next_due(0) == NOW - 7


def test_extend_keeps_a_member_from_being_reclaimed(index: RedisIndex) -> None:
    index.add(items(1))
    (m,) = index.lease(0, NOW, 1_000, 10, "A").members
    assert index.extend(0, "B", [m], NOW + 500, 1_000) == 0  # not B's to extend
    assert index.extend(0, "A", [m], NOW + 500, 1_000) == 1  # deadline now NOW + 1_500

    held = index.lease(0, NOW + 1_499, LEASE_MS, 10, "B")
    assert (held.members, held.reclaimed) == ([], 0)
    assert index.due_counts([0], NOW + 1_499) == {}
    assert index.lease(0, NOW + 1_500, LEASE_MS, 10, "B").members == [m]


def test_release_gives_a_member_back_at_once(index: RedisIndex) -> None:
    index.add(items(2))
    m1, m2 = index.lease(0, NOW, LEASE_MS, 10, "A").members
    assert index.release(0, "B", [m1]) == 0  # not B's
    assert index.release(0, "A", [m1]) == 1
    assert index.size(0) == (1, 1)
    assert index.next_due(0) == NOW
    assert index.lease(0, NOW, LEASE_MS, 10, "B").members == [m1]  # no lease expiry to wait
    assert index.ack(0, "A", [m1, m2]) == 1  # only m2 is still A's


def test_empty_member_lists_are_no_ops(index: RedisIndex) -> None:
    assert index.add([]) == 0
    assert index.remove([]) == 0
    assert index.ack(0, "A", []) == 0
    assert index.extend(0, "A", [], NOW, LEASE_MS) == 0
    assert index.release(0, "A", []) == 0
    assert index.due_counts([], NOW) == {}


def test_remove_drops_due_members_but_leaves_leased_ones(index: RedisIndex) -> None:
    its = items(3)
    index.add(its[:1])
    (leased,) = index.lease(0, NOW, LEASE_MS, 10, "A").members
    index.add(its[1:])
    assert index.remove(its) == 2
    assert index.size(0) == (0, 1)
    assert index.ack(0, "A", [leased]) == 1


def test_unknown_bucket_is_rejected(index: RedisIndex) -> None:
    with pytest.raises(ValueError):
        index.lease(1, NOW, LEASE_MS, 10, "A")


# --- Redis losing state ---------------------------------------------------------------------


def test_flushall_just_empties_the_index(index: RedisIndex, redis_client: redis.Redis) -> None:
    index.add(items(3))
    (m, *_) = index.lease(0, NOW, LEASE_MS, 1, "A").members
    redis_client.flushall()
    assert index.size(0) == (0, 0)
    assert index.due_counts([0], NOW + LEASE_MS) == {}
    assert index.lease(0, NOW + LEASE_MS, LEASE_MS, 10, "A") == Leased([], 0)
    assert index.ack(0, "A", [m]) == 0
    assert index.add(items(3)) == 3  # the migrator rebuilds from DynamoDB


def test_scripts_still_work_after_script_flush(redis_client: redis.Redis) -> None:
    index = RedisIndex(redis_client, bucket_count=4)
    lock = Lock(redis_client, "tq:lock:test", 60_000)
    its = items(40)
    assert index.add(its[:20]) == 20  # scripts now cached by the server
    assert lock.acquire("me")

    redis_client.script_flush()
    assert index.add(its) == 20  # pipelined EVALSHA meets NOSCRIPT, falls back
    redis_client.script_flush()
    leased = {b: index.lease(b, NOW, LEASE_MS, 100, "A").members for b in range(4)}
    assert sum(map(len, leased.values())) == 40
    for script_op in (
        lambda b, ms: index.extend(b, "A", ms, NOW, LEASE_MS),
        lambda b, ms: index.release(b, "A", ms),
    ):
        redis_client.script_flush()
        assert sum(script_op(b, ms) for b, ms in leased.items()) == 40
    redis_client.script_flush()
    leased = {b: index.lease(b, NOW, LEASE_MS, 100, "B").members for b in range(4)}
    redis_client.script_flush()
    assert sum(index.ack(b, "B", ms) for b, ms in leased.items()) == 40
    redis_client.script_flush()
    assert lock.renew("me")
    redis_client.script_flush()
    assert lock.release("me")


# --- due_counts -----------------------------------------------------------------------------


class CountingConnection(redis.Connection):
    """Counts writes to the server: a pipeline is one write, so this counts round trips."""

    sent: ClassVar[int] = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


@pytest.fixture
def counting_client(redis_url: str, redis_client: redis.Redis) -> Iterator[redis.Redis]:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    client.ping()  # connect (and handshake) before anything is counted
    try:
        yield client
    finally:
        client.close()
        pool.disconnect()


def test_due_counts_sums_due_and_expired_leases_in_one_round_trip(
    counting_client: redis.Redis,
) -> None:
    index = RedisIndex(counting_client, bucket_count=4)
    ids = {b: [f"tm-{i}" for i in range(200) if bucket_of(f"tm-{i}", 4) == b] for b in range(4)}
    index.add([("t", ids[0][0], NOW - 1), ("t", ids[0][1], NOW)])  # bucket 0: two due
    index.add([("t", ids[1][0], NOW - 1), ("t", ids[1][1], NOW)])  # bucket 1: two to lease
    index.lease(1, NOW, 500, 1, "A")  # expires at NOW + 500
    index.lease(1, NOW, 10_000, 1, "A")  # expires later
    index.add([("t", ids[2][0], NOW + 1)])  # bucket 2: only future work; bucket 3 empty

    CountingConnection.sent = 0
    assert index.due_counts(range(4), NOW) == {0: 2}
    assert index.due_counts(range(4), NOW + 500) == {0: 2, 1: 1, 2: 1}
    assert CountingConnection.sent == 2  # one round trip per call, however many buckets


# --- cluster mode: one slot per script ------------------------------------------------------


def test_all_keys_of_a_bucket_share_one_slot_and_buckets_spread() -> None:
    index = RedisIndex(redis.Redis(), bucket_count=256, prefix="custom")  # no I/O needed
    slots: list[int] = []
    for b in range(256):
        keys = index.keys(b)
        assert all(k.startswith(f"custom:{{b{b}}}:") for k in keys)
        bucket_slots = {key_slot(k.encode()) for k in keys}
        assert len(bucket_slots) == 1
        slots += bucket_slots
    assert len(set(slots)) > 200  # spread over the cluster, not one hot slot


@pytest.mark.parametrize("client_class", [redis.RedisCluster, redis.Redis])
def test_every_operation_runs_on_a_cluster_mode_server(
    redis_cluster_url: str, client_class: type[redis.Redis] | type[redis.RedisCluster]
) -> None:
    # The cluster node refuses CROSSSLOT scripts; RedisCluster also routes by slot.
    client: Any = client_class.from_url(redis_cluster_url)
    try:
        client.flushall()
        client.script_flush()
        index = RedisIndex(client, bucket_count=8)
        its = items(100)
        assert index.add(its) == 100
        counts = index.due_counts(range(8), NOW)
        assert sum(counts.values()) == 100
        got = set()
        for b in counts:
            leased = index.lease(b, NOW, LEASE_MS, 1_000, "A").members
            assert index.extend(b, "A", leased, NOW, LEASE_MS) == len(leased)
            assert index.release(b, "A", leased[:1]) == 1
            assert index.lease(b, NOW, LEASE_MS, 1_000, "B").members == leased[:1]
            assert index.ack(b, "A", leased) == len(leased) - 1
            assert index.ack(b, "B", leased) == 1
            got |= set(leased)
        assert got == members_of(its)
        assert index.remove(its) == 0
        lock = Lock(client, "tq:lock:fanout", 60_000)
        assert lock.acquire("me") and lock.renew("me") and lock.release("me")
    finally:
        client.close()


# --- Lock -----------------------------------------------------------------------------------


def test_lock_is_exclusive_and_only_its_token_renews_or_releases(
    redis_client: redis.Redis,
) -> None:
    lock = Lock(redis_client, "tq:lock:fanout", 60_000)
    assert lock.acquire("run-1")
    assert 0 < redis_client.pttl(lock.key) <= 60_000
    assert not lock.acquire("run-2")
    assert not lock.renew("run-2")
    assert not lock.release("run-2")
    assert redis_client.get(lock.key) == b"run-1"

    redis_client.pexpire(lock.key, 1_000)
    assert lock.renew("run-1")
    assert redis_client.pttl(lock.key) > 1_000
    assert lock.release("run-1")
    assert redis_client.exists(lock.key) == 0
    assert lock.acquire("run-2")


def test_expired_lock_goes_to_the_next_token(redis_client: redis.Redis) -> None:
    lock = Lock(redis_client, "tq:lock:fanout", 60_000)
    assert lock.acquire("run-1")
    redis_client.pexpireat(lock.key, 1)  # expire it now, deterministically
    assert lock.acquire("run-2")
    assert not lock.renew("run-1")
    assert not lock.release("run-1")
    assert redis_client.get(lock.key) == b"run-2"


def test_lock_ttl_really_expires(redis_client: redis.Redis) -> None:
    lock = Lock(redis_client, "tq:lock:short", 50)
    assert lock.acquire("run-1")
    assert not lock.acquire("run-2")
    deadline = time.monotonic() + 2  # bounded wait for the 50 ms PX, the only one in this file
    while (left := redis_client.pttl(lock.key)) != -2 and time.monotonic() < deadline:
        time.sleep(max(left, 1) / 1000)
    assert lock.acquire("run-2")
