"""RedisIndex and Lock against a real redis-server: the guarantees of the fire path's index.

Time is always an argument (``now_ms``, ``until_ms``, ...); the only wall-clock wait in this
file is the Lock test that lets a 50 ms TTL really expire.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pytest
import redis
from redis.crc import key_slot

from timers.adapters.redis_index import (
    ALIVE,
    DONE_KEEP_MS,
    ENSURE_CHUNK,
    FIRED,
    HINTS_KEY,
    MISSING,
    SUPERSEDED,
    Leased,
    Lock,
    Placement,
    RedisIndex,
)
from timers.core.chain import Member, check_name

pytestmark = pytest.mark.integration

NOW = 1_700_000_000_000  # a fixed "now" in epoch ms
LEASE_MS = 30_000
BUCKETS = 4


@pytest.fixture
def index(redis_client: redis.Redis) -> RedisIndex:
    return RedisIndex(redis_client, bucket_count=BUCKETS)


def mem(
    timer: str,
    due: int = NOW,
    rev: int = 1,
    *,
    n: int = 0,
    pv: int | None = None,
    tenant: str = "acme",
) -> Member:
    return Member(tenant, timer, due, rev, n, pv)


def card(rev: int, name: str = "x") -> str:
    """A card as ``to_card`` writes it: the revision, a bar, the timer as JSON."""
    return f'{rev}|{{"nm":"{name}"}}'


def many(n: int, due: int = NOW, *, tenant: str = "acme", prefix: str = "") -> list[Member]:
    """``n`` timers' first positions (timer ids are unique across tenants, as the api makes
    them)."""
    return [mem(f"{prefix or tenant}-{i:05d}", due, tenant=tenant) for i in range(n)]


def placed(members: Sequence[Member], bucket: int = 0, with_card: bool = False) -> list[Placement]:
    return [(bucket, m, card(m.rev) if with_card else None) for m in members]


def lease(index: RedisIndex, owner: str, *, now: int = NOW, limit: int = 100, **kw: Any) -> Leased:
    """Lease from bucket 0: members due by ``until`` (default now), for LEASE_MS."""
    until = kw.pop("until", now)
    bucket = kw.pop("bucket", 0)
    deadline = kw.pop("deadline", now + LEASE_MS)
    return index.lease(
        bucket, now_ms=now, until_ms=until, deadline_ms=deadline, limit=limit, owner=owner, **kw
    )


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def zset(client: redis.Redis, key: str) -> dict[str, int]:
    pairs: Any = client.zrange(key, 0, -1, withscores=True)
    return {text(m): int(s) for m, s in pairs}


def holders(client: redis.Redis, index: RedisIndex, bucket: int = 0) -> dict[str, str]:
    """Each leased member -> the token of the run whose lease holds it."""
    got: Any = client.hgetall(index.keys(bucket).owner)
    return {text(m): text(lease_id).split("/")[0] for m, lease_id in got.items()}


def due_of(client: redis.Redis, index: RedisIndex, bucket: int = 0) -> dict[str, int]:
    return zset(client, index.keys(bucket).due)


def head_of(client: redis.Redis, index: RedisIndex, timer: str, bucket: int = 0) -> str | None:
    got = client.hget(index.keys(bucket).heads, timer)
    return None if got is None else text(got)


def card_of(client: redis.Redis, index: RedisIndex, timer: str, bucket: int = 0) -> str | None:
    got = client.hget(index.keys(bucket).data, timer)
    return None if got is None else text(got)


def hints(client: redis.Redis) -> dict[int, int]:
    return {int(b): s for b, s in zset(client, HINTS_KEY).items()}


# ---------------------------------------------------------------- members


def test_member_round_trips_through_its_string() -> None:
    first = mem("tm-1", NOW, 3)
    later = mem("tm-1", NOW + 60_000, 3, n=7, pv=NOW)
    assert str(first) == f"acme|tm-1|{NOW}|3|0|"
    assert str(later) == f"acme|tm-1|{NOW + 60_000}|3|7|{NOW}"
    for m in (first, later, mem("t", 0, 0, pv=0)):
        assert Member.parse(str(m)) == m
    for bad in ("ac|me", "tm@1", ""):
        with pytest.raises(ValueError):
            check_name(bad, "name")  # what would break the member's fields


# ---------------------------------------------------------------- ensure


def test_ensure_is_idempotent(index: RedisIndex, redis_client: redis.Redis) -> None:
    members = many(3)
    assert index.ensure(placed(members)) == 3
    assert index.ensure(placed(members)) == 0
    other = mem("tm-other", NOW + 1, tenant="beta")
    assert index.ensure(placed([*members, other])) == 1
    assert due_of(redis_client, index) == {str(m): m.due for m in [*members, other]}
    assert {m.timer_id: head_of(redis_client, index, m.timer_id) for m in members} == {
        m.timer_id: str(m) for m in members
    }
    assert index.ensure([]) == 0


def test_ensure_skips_a_live_chain_of_the_same_revision(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    first = mem("tm-1", NOW, 2)
    assert index.ensure(placed([first])) == 1
    # another position of the same revision (the migrator walked from an older checkpoint)
    assert index.ensure(placed([mem("tm-1", NOW + 60_000, 2, n=1, pv=NOW)])) == 0
    (leased,) = lease(index, "A").members
    assert leased == first
    # leased is alive too: re-adding must not hand the timer to a second trigger
    assert index.ensure(placed([first, mem("tm-1", NOW + 60_000, 2, n=1, pv=NOW)])) == 0
    assert due_of(redis_client, index) == {}
    # the head lost from due and lease (Redis lost the last writes): the chain is re-added
    redis_client.hdel(index.keys(0).owner, str(first))
    assert index.ensure(placed([first])) == 1
    assert due_of(redis_client, index) == {str(first): NOW}


def test_a_newer_revision_replaces_an_older_head_and_its_due_member(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    old = mem("tm-1", NOW, 1)
    new = mem("tm-1", NOW + 5_000, 2)
    assert index.ensure(placed([old], with_card=True)) == 1
    assert index.ensure(placed([new], with_card=True)) == 1
    assert due_of(redis_client, index) == {str(new): new.due}
    assert head_of(redis_client, index, "tm-1") == str(new)
    assert card_of(redis_client, index, "tm-1") == card(2)


def test_an_older_revision_never_replaces_a_newer(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    new = mem("tm-1", NOW + 5_000, 3)
    assert index.ensure(placed([new], with_card=True)) == 1
    assert index.ensure(placed([mem("tm-1", NOW, 2)], with_card=True)) == 0
    # not even once the newer chain is gone from due (a newer head owns the timer)
    redis_client.zrem(index.keys(0).due, str(new))
    assert index.ensure(placed([mem("tm-1", NOW, 2)], with_card=True)) == 0
    assert due_of(redis_client, index) == {}
    assert head_of(redis_client, index, "tm-1") == str(new)
    assert card_of(redis_client, index, "tm-1") == card(3)


def test_ensure_skips_members_that_fired_recently(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    one_shot = mem("tm-1", NOW)
    index.ensure(placed([one_shot], with_card=True))
    (m,) = lease(index, "A").members
    assert index.finish(0, "A", NOW, [(m, None)]) is None
    assert head_of(redis_client, index, "tm-1") is None  # the chain left Redis...
    assert index.ensure(placed([one_shot], with_card=True)) == 0  # ...but done remembers it
    assert due_of(redis_client, index) == {}
    # another position of the timer is not in done: it goes in
    assert index.ensure(placed([mem("tm-1", NOW + 1_000)])) == 1


def test_ensure_chunks_a_big_batch_and_keeps_every_member(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    n = ENSURE_CHUNK * 2 + 7
    first, second = many(n), many(5, NOW - 10, prefix="other")
    # one timer twice, in different chunks: the newer revision (later chunk) wins
    old, new = mem("tm-twice", NOW, 1), mem("tm-twice", NOW + 1, 2)
    batch = [*placed(first[:3]), (0, old, None), *placed(first[3:]), (0, new, None)]
    assert index.ensure(batch + placed(second, bucket=1)) == n + 2 + 5
    assert due_of(redis_client, index) == {str(m): m.due for m in [*first, new]}
    assert due_of(redis_client, index, 1) == {str(m): m.due for m in second}
    assert hints(redis_client) == {0: NOW, 1: NOW - 10}


def test_ensure_writes_a_card_only_if_not_older_than_the_one_there(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    index.ensure([(0, mem("tm-1", NOW, 1), card(1, "one"))])
    assert card_of(redis_client, index, "tm-1") == card(1, "one")
    index.ensure([(0, mem("tm-1", NOW, 2), None)])  # no card given: the old one stays
    assert card_of(redis_client, index, "tm-1") == card(1, "one")
    assert head_of(redis_client, index, "tm-1") == str(mem("tm-1", NOW, 2))

    redis_client.hset(index.keys(0).data, "tm-1", card(9, "nine"))  # a newer card is there
    assert index.ensure([(0, mem("tm-1", NOW, 3), card(3, "three"))]) == 1
    assert card_of(redis_client, index, "tm-1") == card(9, "nine")
    assert index.ensure([(0, mem("tm-1", NOW, 9), card(9, "nine again"))]) == 1
    assert card_of(redis_client, index, "tm-1") == card(9, "nine again")  # same rev: written


def test_ensure_lowers_the_hint_and_never_raises_it(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    index.ensure(placed([mem("a", NOW + 5_000)]))
    assert hints(redis_client) == {0: NOW + 5_000}
    index.ensure(placed([mem("b", NOW + 9_000)]) + placed([mem("c", NOW + 7_000)], bucket=2))
    assert hints(redis_client) == {0: NOW + 5_000, 2: NOW + 7_000}
    index.ensure(placed([mem("d", NOW + 9_000), mem("e", NOW + 1_000), mem("f", NOW + 3_000)]))
    assert hints(redis_client) == {0: NOW + 1_000, 2: NOW + 7_000}
    # a skipped member (its chain is alive) hints nothing, however early it is
    assert index.ensure(placed([mem("a", NOW - 60_000, n=1)])) == 0
    assert hints(redis_client) == {0: NOW + 1_000, 2: NOW + 7_000}


# ---------------------------------------------------------------- alive


def test_alive_answers_fired_superseded_alive_or_missing(index: RedisIndex) -> None:
    index.ensure(
        placed([mem("due", NOW, 2), mem("leased", NOW - 1, 1), mem("fired", NOW - 2, 1)])
        + placed([mem("elsewhere", NOW, 1)], bucket=3)
    )
    got = lease(index, "A", limit=2).members
    assert got == [mem("fired", NOW - 2, 1), mem("leased", NOW - 1, 1)]
    index.finish(0, "A", NOW, [(mem("fired", NOW - 2, 1), None)])

    checks = [
        (0, "due", 2, mem("due", NOW, 2)),  # in due at this revision
        (0, "due", 1, None),  # a newer revision owns it
        (0, "due", 3, None),  # asked at a newer revision than Redis has
        (0, "leased", 1, mem("leased", NOW - 1, 1)),  # in a lease
        (0, "fired", 1, mem("fired", NOW - 2, 1)),  # finished recently
        (0, "fired", 1, None),  # no member to look up, and the chain left Redis
        (0, "never", 1, None),
        (3, "elsewhere", 1, None),
        (1, "elsewhere", 1, None),  # the wrong bucket knows nothing
    ]
    expected = [ALIVE, SUPERSEDED, MISSING, ALIVE, FIRED, MISSING, MISSING, ALIVE, MISSING]
    assert index.alive(checks) == expected
    # more checks than a script call takes, interleaved across buckets: answers in input order
    big = checks * (ENSURE_CHUNK // 3)
    assert len(big) > 2 * ENSURE_CHUNK
    assert index.alive(big) == expected * (ENSURE_CHUNK // 3)
    assert index.alive([]) == []


# ---------------------------------------------------------------- lease


def test_lease_takes_only_members_due_by_until_oldest_first_within_the_limit(
    index: RedisIndex,
) -> None:
    late, early, mid = mem("late", NOW), mem("early", NOW - 5_000), mem("mid", NOW - 10)
    future = mem("future", NOW + 1)
    index.ensure(placed([late, early, mid, future]))

    first = lease(index, "A", limit=2)
    assert first.members == [early, mid]
    assert (first.reclaimed, first.next_due) == (0, NOW)
    second = lease(index, "A")
    assert second.members == [late]  # due exactly at until counts
    assert second.next_due == NOW + 1
    nothing = lease(index, "A")
    assert (nothing.members, nothing.next_due) == ([], NOW + 1)  # never what is not due yet
    armed = lease(index, "A", until=NOW + 250)  # the trigger leases ARM_MS ahead
    assert (armed.members, armed.next_due) == ([future], None)


def test_lease_round_robins_across_tenants_when_more_are_candidates_than_it_takes(
    index: RedisIndex,
) -> None:
    # Same due time: Redis orders them by member, so every one of acme's comes before zeta's.
    burst = many(39, tenant="acme")
    lone = mem("tm-lone", tenant="zeta")
    index.ensure(placed([*burst, lone]))
    first = lease(index, "A", limit=10)  # scans 4 x 10 candidates: the lone one is the last
    assert lone in first.members
    assert first.members == [burst[0], lone, *burst[1:9]]  # one of each tenant per round

    index.ensure(placed(many(6, NOW - 1, tenant="beta") + many(2, NOW - 1, tenant="gamma")))
    got = lease(index, "A", limit=9).members
    assert Counter(m.tenant for m in got) == {"acme": 3, "beta": 4, "gamma": 2}

    # no more candidates than the limit: plain due order, whatever the tenants
    rest = lease(index, "A", limit=1_000).members
    assert rest == sorted(rest, key=lambda m: (m.due, str(m)))
    assert len(first.members) + len(got) + len(rest) == 40 + 8


def test_lease_returns_the_cards_and_the_next_due(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    with_card, without = mem("carded", NOW - 1, 4), mem("bare", NOW)
    index.ensure([(0, with_card, card(4)), (0, without, None), (0, mem("later", NOW + 9), None)])
    got = lease(index, "A")
    assert got.members == [with_card, without]
    assert got.cards == {"carded": card(4), "bare": None}
    assert got.next_due == NOW + 9
    assert holders(redis_client, index) == {str(with_card): "A", str(without): "A"}
    k = index.keys(0)
    (lease_id,) = zset(redis_client, k.lease)  # one lease per call, not an entry per member
    assert zset(redis_client, k.lease) == {lease_id: NOW + LEASE_MS}
    assert redis_client.hget(k.held, lease_id) == f"{with_card}\n{without}".encode()
    assert redis_client.hget(k.held, f"{lease_id}#") == b"2"


def test_lease_reclaims_expired_leases_first(index: RedisIndex, redis_client: redis.Redis) -> None:
    m = mem("tm-1", NOW - 7)
    index.ensure(placed([m]))
    assert lease(index, "A", deadline=NOW + 1_000).members == [m]

    held = lease(index, "B", now=NOW + 999)
    assert (held.members, held.reclaimed, held.next_due) == ([], 0, None)  # still A's
    back = lease(index, "B", now=NOW + 1_000, limit=0)  # a lease deadline is exclusive
    assert (back.members, back.reclaimed, back.next_due) == ([], 1, NOW - 7)
    assert due_of(redis_client, index) == {str(m): NOW - 7}  # back at its own due score
    assert redis_client.hgetall(index.keys(0).owner) == {}

    lease(index, "A", deadline=NOW + 1_000)
    again = lease(index, "B", now=NOW + 1_000)  # reclaimed and taken in one call
    assert (again.members, again.reclaimed) == ([m], 1)
    assert holders(redis_client, index) == {str(m): "B"}


def test_an_expired_lease_gives_back_only_what_it_still_holds(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    """A lease is one record (id, deadline, members): at its deadline, only the members it
    still holds go back - not one its run finished, nor one released and leased again under
    the run's next lease (that one comes back with its own lease)."""
    m1, m2, m3 = mem("tm-1", NOW - 3), mem("tm-2", NOW - 2), mem("tm-3", NOW - 1)
    index.ensure(placed([m1, m2, m3]))
    assert lease(index, "A", deadline=NOW + 1_000).members == [m1, m2, m3]
    index.finish(0, "A", NOW, [(m1, None)])
    assert index.release(0, "A", {m2: NOW}) == 1
    assert lease(index, "A", deadline=NOW + 5_000).members == [m2]
    back = lease(index, "B", now=NOW + 1_000, limit=0)
    assert back.reclaimed == 1 and due_of(redis_client, index) == {str(m3): m3.due}
    assert holders(redis_client, index) == {str(m2): "A"}
    again = lease(index, "B", now=NOW + 5_000, limit=0)
    assert again.reclaimed == 1 and due_of(redis_client, index) == {
        str(m2): m2.due, str(m3): m3.due,
    }  # fmt: skip
    assert zset(redis_client, index.keys(0).lease) == {}
    assert set(redis_client.hkeys(index.keys(0).held)) == {b"#seq"}  # nothing left behind


def test_lease_rejects_bad_arguments(index: RedisIndex) -> None:
    with pytest.raises(ValueError):
        lease(index, "A", limit=-1)
    with pytest.raises(ValueError):
        lease(index, "A", deadline=NOW)
    with pytest.raises(ValueError):
        lease(index, "A", bucket=BUCKETS)
    with pytest.raises(ValueError):
        RedisIndex(redis.Redis(), bucket_count=0)


def test_lease_answers_members_with_either_client_decoding(
    redis_url: str, redis_client: redis.Redis
) -> None:
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        index = RedisIndex(client, bucket_count=1)
        index.ensure([(0, mem("tm-1"), card(1))])
        got = lease(index, "A")
        assert (got.members, got.cards) == ([mem("tm-1")], {"tm-1": card(1)})
        assert index.hints_until(NOW) == [(0, NOW)]
        assert index.finish(0, "A", NOW, [(mem("tm-1"), mem("tm-1", NOW + 5))]) == NOW + 5


def test_interleaved_leasers_get_disjoint_members_covering_everything_once(
    index: RedisIndex,
) -> None:
    due = many(25) + many(7, NOW - 3, tenant="beta")
    index.ensure(placed(due + many(5, NOW + 60_000, prefix="later")))
    got: dict[str, list[Member]] = {"A": [], "B": []}
    while True:
        a = lease(index, "A", limit=3).members
        b = lease(index, "B", limit=4).members
        if not a and not b:
            break
        got["A"] += a
        got["B"] += b
    assert not set(got["A"]) & set(got["B"])
    assert sorted(got["A"] + got["B"]) == sorted(due)


def test_concurrent_threads_split_a_big_bucket_exactly(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    due = many(1_500) + many(500, tenant="beta")
    index.ensure(placed(due))
    threads = 8
    start = threading.Barrier(threads)
    got: list[list[Member]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        start.wait()
        while batch := lease(index, f"owner-{t}", limit=37).members:
            got[t] += batch

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()

    everyone = [m for batch in got for m in batch]
    assert len(everyone) == len(set(everyone)) == 2_000  # pairwise disjoint
    assert set(everyone) == set(due)
    owners = holders(redis_client, index)
    for t, batch in enumerate(got):
        assert {owners[str(m)] for m in batch} <= {f"owner-{t}"}
    assert index.members(0) == ([], sorted(due, key=lambda m: str(m)))


LEASER = """
import json, sys
import redis
from timers.adapters.redis_index import RedisIndex
url, owner, now = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = redis.Redis.from_url(url)
index = RedisIndex(client, bucket_count=4)
client.blpop(["go"])  # every process starts when the test says so
got = []
while batch := index.lease(0, now_ms=now, until_ms=now, deadline_ms=now + 30_000, limit=23,
                           owner=owner).members:
    got += [str(m) for m in batch]
print(json.dumps(got))
"""


def test_concurrent_processes_split_a_big_bucket_exactly(
    index: RedisIndex, redis_client: redis.Redis, redis_url: str
) -> None:
    due = many(1_200) + many(300, tenant="beta")
    index.ensure(placed(due))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LEASER, redis_url, f"proc-{p}", str(NOW)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in range(4)
    ]
    redis_client.rpush("go", *["go"] * len(procs))
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(procs)
    got = [[Member.parse(m) for m in json.loads(out)] for out in outputs]
    everyone = [m for batch in got for m in batch]
    assert len(everyone) == len(set(everyone)) == 1_500
    assert set(everyone) == set(due)
    owners = holders(redis_client, index)
    for p, batch in enumerate(got):
        assert {owners[str(m)] for m in batch} <= {f"proc-{p}"}


# ---------------------------------------------------------------- finish


def test_finish_acks_only_the_owners_lease(index: RedisIndex, redis_client: redis.Redis) -> None:
    m = mem("tm-1")
    index.ensure(placed([m]))
    lease(index, "A", deadline=NOW + 1_000)
    assert lease(index, "B", now=NOW + 1_000).members == [m]  # A was too slow

    index.finish(0, "A", NOW + 1_001, [(m, None)])
    k = index.keys(0)
    ((b_lease, deadline),) = zset(redis_client, k.lease).items()
    assert b_lease.startswith("B/") and deadline == NOW + 1_000 + LEASE_MS
    assert holders(redis_client, index) == {str(m): "B"}  # still B's lease
    assert zset(redis_client, k.done) == {str(m): NOW + 1_001}  # but it is finished

    index.finish(0, "B", NOW + 1_002, [(m, None)])
    assert index.members(0) == ([], [])
    assert redis_client.hgetall(k.owner) == {}
    assert zset(redis_client, k.lease) == {}  # a lease that let go of everything is gone
    assert set(redis_client.hkeys(k.held)) == {b"#seq"}


def test_finish_chains_the_next_member_while_the_finished_one_is_the_head(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    m0 = mem("tm-1", NOW, 1)
    m1 = mem("tm-1", NOW + 60_000, 1, n=1, pv=NOW)
    index.ensure([(0, m0, card(1))])
    lease(index, "A")
    assert index.finish(0, "A", NOW, [(m0, m1)]) == m1.due
    assert index.members(0) == ([m1], [])
    assert head_of(redis_client, index, "tm-1") == str(m1)
    assert card_of(redis_client, index, "tm-1") == card(1)
    assert index.alive([(0, "tm-1", 1, m0), (0, "tm-1", 1, m1)]) == [FIRED, ALIVE]

    # a change (rev 2) arrives while m1 is leased: finishing m1 must not chain rev 1 on
    lease(index, "A", until=m1.due)
    m_new = mem("tm-1", NOW + 30_000, 2)
    index.ensure([(0, m_new, card(2))])
    stale_next = mem("tm-1", NOW + 120_000, 1, n=2, pv=m1.due)
    assert index.finish(0, "A", NOW + 60_000, [(m1, stale_next)]) == m_new.due
    assert index.members(0) == ([m_new], [])
    assert head_of(redis_client, index, "tm-1") == str(m_new)
    assert card_of(redis_client, index, "tm-1") == card(2)


def test_finish_with_no_next_drops_the_head_and_the_card(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    m, other = mem("tm-1"), mem("tm-2", NOW + 5)
    index.ensure([(0, m, card(1)), (0, other, card(1))])
    lease(index, "A")
    assert index.finish(0, "A", NOW, [(m, None)]) == NOW + 5
    assert head_of(redis_client, index, "tm-1") is None
    assert card_of(redis_client, index, "tm-1") is None
    assert card_of(redis_client, index, "tm-2") == card(1)  # others keep theirs
    assert index.alive([(0, "tm-1", 1, None), (0, "tm-1", 1, m)]) == [MISSING, FIRED]


def test_finish_never_re_adds_a_next_that_already_fired(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    m0 = mem("tm-1", NOW, 1)
    m1 = mem("tm-1", NOW + 1_000, 1, n=1, pv=NOW)
    index.ensure(placed([m1]))  # m1 fired first (a run that took over the chain)
    lease(index, "A", until=m1.due)
    index.finish(0, "A", NOW + 1_000, [(m1, None)])
    index.ensure(placed([m0]))  # then an older position came back (rebuilt from DynamoDB)
    lease(index, "B")
    assert index.finish(0, "B", NOW + 1_001, [(m0, m1)]) is None
    assert index.members(0) == ([], [])  # m1 is in done: not fired twice
    assert set(zset(redis_client, index.keys(0).done)) == {str(m0), str(m1)}


def test_finish_prunes_done_after_DONE_KEEP_MS(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    m, m2, m3 = mem("tm-1"), mem("tm-2"), mem("tm-3")
    index.ensure(placed([m, m2, m3]))
    lease(index, "A")
    done = index.keys(0).done
    index.finish(0, "A", NOW, [(m, None)])
    index.finish(0, "A", NOW + DONE_KEEP_MS - 1, [(m2, None)])
    assert set(zset(redis_client, done)) == {str(m), str(m2)}
    index.finish(0, "A", NOW + DONE_KEEP_MS, [(m3, None)])
    assert set(zset(redis_client, done)) == {str(m2), str(m3)}
    assert index.ensure(placed([m])) == 1  # forgotten: a re-add is a fresh schedule again
    assert index.ensure(placed([m2])) == 0


def test_finish_returns_the_earliest_due(index: RedisIndex) -> None:
    index.ensure(placed([mem("a", NOW), mem("b", NOW + 70), mem("c", NOW + 50)]))
    lease(index, "A")
    assert index.finish(0, "A", NOW, [(mem("a", NOW), mem("a", NOW + 20, n=1))]) == NOW + 20
    assert index.finish(0, "A", NOW, []) is None
    lease(index, "A", until=NOW + 100)
    finished = [(mem(t, d), None) for t, d in [("a", NOW + 20), ("b", NOW + 70), ("c", NOW + 50)]]
    assert index.finish(0, "A", NOW + 100, finished) is None  # nothing left


# ---------------------------------------------------------------- release


def test_release_only_for_the_owner_and_a_later_score_defers(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    m1, m2 = mem("tm-1"), mem("tm-2")
    index.ensure(placed([m1, m2]))
    assert lease(index, "A").members == [m1, m2]
    assert index.release(0, "B", {m1: NOW}) == 0  # not B's
    assert index.members(0) == ([], [m1, m2])
    redis_client.delete(HINTS_KEY)
    assert index.release(0, "A", {m1: NOW + 5_000}) == 1  # another run's claim lapses then
    assert index.members(0) == ([m1], [m2])
    assert hints(redis_client) == {0: NOW + 5_000}
    assert lease(index, "B").members == []  # deferred: not leasable at its due time
    assert index.backlog([0], NOW + 4_999, NOW) == {0: 0}
    assert lease(index, "B", now=NOW + 4_999, until=NOW + 4_999).members == []
    assert lease(index, "B", now=NOW + 5_000, until=NOW + 5_000).members == [m1]
    assert index.release(0, "A", {m2: NOW}) == 1
    assert lease(index, "C", now=NOW + 5_000).members == [m2]  # no lease expiry to wait for
    assert index.release(0, "A", {}) == 0


# ---------------------------------------------------------------- replace


def test_replace_swaps_the_head_unless_a_newer_revision_is_there(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    old = mem("tm-1", NOW + 9_000, 1)
    index.ensure([(0, old, card(1))])
    new = mem("tm-1", NOW + 3_000, 2)
    assert index.replace(0, "tm-1", 2, new, card(2))
    assert index.members(0) == ([new], [])
    assert (head_of(redis_client, index, "tm-1"), card_of(redis_client, index, "tm-1")) == (
        str(new),
        card(2),
    )
    assert hints(redis_client) == {0: NOW + 3_000}

    assert not index.replace(0, "tm-1", 1, old, card(1))  # an older change lost the race
    assert index.members(0) == ([new], [])
    assert card_of(redis_client, index, "tm-1") == card(2)

    assert index.replace(0, "tm-1", 3, None, None)  # paused or deleted: the chain leaves
    assert index.members(0) == ([], [])
    assert head_of(redis_client, index, "tm-1") is None
    assert card_of(redis_client, index, "tm-1") is None
    assert index.ensure(placed([mem("tm-1", NOW, 3)])) == 1  # the head is gone: may come back
    assert index.replace(0, "tm-new", 1, mem("tm-new", NOW - 1), None)  # a new timer


# ---------------------------------------------------------------- dispatch: hints


def test_hints_until_lists_the_buckets_due_by_until(index: RedisIndex) -> None:
    index.hint(2, NOW + 300)
    index.hint(0, NOW + 100)
    index.hint(3, NOW + 201)
    assert index.hints_until(NOW - 1) == []
    assert index.hints_until(NOW + 200) == [(0, NOW + 100)]
    assert index.hints_until(NOW + 300) == [(0, NOW + 100), (3, NOW + 201), (2, NOW + 300)]
    assert index.hints_until(NOW + 300, limit=2) == [(0, NOW + 100), (3, NOW + 201)]
    index.hint(2, NOW + 999)  # never raised
    index.hint(3, NOW - 5)
    assert index.hints_until(NOW + 300) == [(3, NOW - 5), (0, NOW + 100), (2, NOW + 300)]


def test_take_hint_removes_it_only_if_unchanged(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    index.hint(1, NOW)
    ((bucket, seen),) = index.hints_until(NOW)
    assert (bucket, seen) == (1, NOW)
    assert not index.take_hint(1, NOW + 1)
    index.hint(1, NOW - 40)  # a member added meanwhile lowered it
    assert not index.take_hint(1, seen)
    assert hints(redis_client) == {1: NOW - 40}  # it survives for the next poll
    assert index.take_hint(1, NOW - 40)
    assert hints(redis_client) == {}
    assert not index.take_hint(1, NOW - 40)


def test_backlog_counts_due_by_until_and_expired_leases(index: RedisIndex) -> None:
    index.ensure(placed([mem("a", NOW - 1), mem("b", NOW + 150), mem("c", NOW + 201)]))
    index.ensure(placed([mem("d", NOW), mem("e", NOW)], bucket=1))
    index.lease(1, now_ms=NOW, until_ms=NOW, deadline_ms=NOW + 500, limit=1, owner="A")
    index.lease(1, now_ms=NOW, until_ms=NOW, deadline_ms=NOW + 10_000, limit=1, owner="A")
    assert index.backlog([0, 1, 2], NOW + 200, NOW) == {0: 2, 1: 0, 2: 0}
    assert index.backlog([0, 1], NOW + 201, NOW + 499) == {0: 3, 1: 0}
    assert index.backlog([1], NOW + 700, NOW + 500) == {1: 1}  # an expired lease is due work
    assert index.backlog([], NOW, NOW) == {}


def test_sweep_rehints_every_non_empty_bucket_from_due_and_lease(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    index.ensure(placed([mem("a", NOW + 40), mem("b", NOW + 90)]))  # bucket 0: due only
    index.ensure(placed([mem("c", NOW)], bucket=1))  # bucket 1: leased only
    index.lease(1, now_ms=NOW, until_ms=NOW, deadline_ms=NOW + 700, limit=9, owner="A")
    index.ensure(placed([mem("d", NOW + 900), mem("e", NOW)], bucket=2))  # bucket 2: both
    index.lease(2, now_ms=NOW, until_ms=NOW, deadline_ms=NOW + 800, limit=9, owner="A")
    redis_client.delete(HINTS_KEY)  # lost, as after a failover
    index.hint(0, NOW + 5)  # and a stale-low one: the sweep never raises a hint

    assert index.sweep() == {0: NOW + 40, 1: NOW + 700, 2: NOW + 800}
    assert hints(redis_client) == {0: NOW + 5, 1: NOW + 700, 2: NOW + 800}
    redis_client.flushall()
    assert index.sweep() == {}
    assert hints(redis_client) == {}


def test_rehint_hints_the_bucket_from_its_earliest(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    assert index.rehint(0) is None
    assert hints(redis_client) == {}
    index.ensure(placed([mem("a", NOW + 40), mem("b", NOW + 90)]))
    index.lease(0, now_ms=NOW, until_ms=NOW + 40, deadline_ms=NOW + 60, limit=1, owner="A")
    redis_client.delete(HINTS_KEY)
    assert index.rehint(0) == NOW + 60  # the lease deadline comes before b's due
    assert hints(redis_client) == {0: NOW + 60}


# ---------------------------------------------------------------- run markers


def test_run_markers_are_set_once_and_touched_or_ended_by_their_token(
    index: RedisIndex, redis_client: redis.Redis
) -> None:
    key = index.run_key(2, 0)
    assert index.start_run(2, 0, "fan-1", 5_000)
    assert 0 < redis_client.pttl(key) <= 5_000
    assert not index.start_run(2, 0, "fan-2", 5_000)  # queued or running: no second run
    assert index.start_run(2, 1, "fan-1", 5_000)  # another slot of the bucket
    assert index.start_run(3, 0, "fan-1", 5_000)  # another bucket

    assert not index.touch_run(2, 0, "fan-2", 60_000)
    assert index.touch_run(2, 0, "fan-1", 60_000)  # the run extends it to its deadline
    assert 5_000 < redis_client.pttl(key) <= 60_000
    assert not index.end_run(2, 0, "fan-2")
    assert redis_client.get(key) == b"fan-1"
    assert index.end_run(2, 0, "fan-1")
    assert redis_client.exists(key) == 0
    assert not index.end_run(2, 0, "fan-1")
    assert not index.touch_run(2, 0, "fan-1", 60_000)  # an ended marker is not revived
    assert index.start_run(2, 0, "fan-2", 5_000)
    with pytest.raises(ValueError):
        index.run_key(BUCKETS, 0)


# ---------------------------------------------------------------- Lock


def test_lock_is_exclusive_and_only_its_token_renews_or_releases(
    redis_client: redis.Redis,
) -> None:
    lock = Lock(redis_client, "tq:{fanout}:lock", 60_000)
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
    assert not lock.renew("run-1")
    assert lock.acquire("run-2")


def test_an_expired_lock_goes_to_the_next_token(redis_client: redis.Redis) -> None:
    lock = Lock(redis_client, "tq:{fanout}:lock", 60_000)
    assert lock.acquire("run-1")
    redis_client.pexpireat(lock.key, 1)  # expire it now, deterministically
    assert lock.acquire("run-2")
    assert not lock.renew("run-1")
    assert not lock.release("run-1")
    assert redis_client.get(lock.key) == b"run-2"


def test_lock_ttl_really_expires(redis_client: redis.Redis) -> None:
    lock = Lock(redis_client, "tq:{fanout}:short", 50)
    assert lock.acquire("run-1")
    assert not lock.acquire("run-2")
    deadline = time.monotonic() + 2  # bounded wait for the 50 ms PX, the only one in this file
    while (left := redis_client.pttl(lock.key)) != -2 and time.monotonic() < deadline:
        time.sleep(max(left, 1) / 1000)
    assert lock.acquire("run-2")


# ---------------------------------------------------------------- Redis losing state


def test_scripts_work_again_after_script_flush(redis_client: redis.Redis) -> None:
    index = RedisIndex(redis_client, bucket_count=BUCKETS)
    lock = Lock(redis_client, "tq:{fanout}:lock", 60_000)
    members = {b: many(30, prefix=f"b{b}") for b in range(BUCKETS)}
    every = [p for b, ms in members.items() for p in placed(ms[:10], bucket=b)]
    assert index.ensure(every) == 40  # scripts now cached by the server
    assert lock.acquire("me")

    def flush() -> None:
        redis_client.script_flush()

    flush()  # pipelined EVALSHA in four buckets meets NOSCRIPT four times
    assert index.ensure([p for b, ms in members.items() for p in placed(ms, bucket=b)]) == 80
    flush()
    checks = [(b, m.timer_id, m.rev, m) for b, ms in members.items() for m in ms]
    assert index.alive(checks) == [ALIVE] * 120
    leased: dict[int, list[Member]] = {}
    for b in range(BUCKETS):
        flush()
        leased[b] = lease(index, "A", bucket=b).members
    assert sum(map(len, leased.values())) == 120
    flush()
    assert sum(index.release(b, "A", {m: m.due for m in ms[:5]}) for b, ms in leased.items()) == 20
    flush()
    following = {b: [(m, mem(m.timer_id, NOW + 1, n=1)) for m in ms] for b, ms in leased.items()}
    assert all(index.finish(b, "A", NOW, done) == NOW + 1 for b, done in following.items())
    flush()
    assert index.replace(0, "b0-00000", 2, mem("b0-00000", NOW + 3, 2), card(2))
    flush()
    assert index.take_hint(0, NOW)
    flush()
    assert index.start_run(0, 0, "tok", 5_000)
    assert index.touch_run(0, 0, "tok", 9_000)
    flush()
    assert index.end_run(0, 0, "tok")
    flush()
    assert lock.renew("me")
    flush()
    assert lock.release("me")


def test_flushall_just_empties_the_index(index: RedisIndex, redis_client: redis.Redis) -> None:
    members = many(3)
    index.ensure(placed(members, with_card=True))
    (m, *_) = lease(index, "A", limit=1).members
    redis_client.flushall()
    assert index.members(0) == ([], [])
    assert index.backlog([0], NOW + LEASE_MS, NOW + LEASE_MS) == {0: 0}
    assert index.hints_until(NOW + LEASE_MS) == []
    assert index.sweep() == {}
    assert lease(index, "A", now=NOW + LEASE_MS) == Leased([], {}, 0, None)
    assert index.alive([(0, x.timer_id, x.rev, x) for x in members]) == [MISSING] * 3
    assert index.finish(0, "A", NOW, [(m, None)]) is None  # a run that outlived the flush
    assert index.alive([(0, x.timer_id, x.rev, x) for x in members]) == [FIRED, MISSING, MISSING]
    assert index.ensure(placed(members, with_card=True)) == 2  # m is in done again: skipped
    assert index.hints_until(NOW) == [(0, NOW)]  # the migrator rebuilds, and hints


# ---------------------------------------------------------------- round trips


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


def test_many_buckets_cost_one_round_trip_per_call(counting_client: redis.Redis) -> None:
    index = RedisIndex(counting_client, bucket_count=16)
    batch = [(b, m, None) for b in range(16) for m in many(20, NOW + b, prefix=f"b{b}")]
    assert index.ensure(batch[:16]) == 16  # loads the script (cold cache)
    CountingConnection.sent = 0
    assert index.ensure(batch) == len(batch) - 16
    assert CountingConnection.sent == 2  # every bucket's script in one pipeline, then the hints
    CountingConnection.sent = 0
    assert index.backlog(range(16), NOW + 100, NOW) == {b: 20 for b in range(16)}
    assert CountingConnection.sent == 1
    CountingConnection.sent = 0
    assert index.sweep() == {b: NOW + b for b in range(16)}
    assert CountingConnection.sent == 2  # the reads, then the hints
    CountingConnection.sent = 0
    assert index.alive([(b, m.timer_id, 1, m) for b, m, _ in batch]) == [ALIVE] * len(batch)
    assert CountingConnection.sent == 1


# ---------------------------------------------------------------- cluster mode


def test_all_keys_of_a_bucket_share_one_slot_and_buckets_spread() -> None:
    index = RedisIndex(redis.Redis(), bucket_count=256, prefix="custom")  # no I/O needed
    slots: list[int] = []
    for b in range(256):
        keys = [*index.keys(b), index.run_key(b, 0), index.run_key(b, 7)]
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
        client.script_flush()  # the first calls meet NOSCRIPT, pipelined and single
        index = RedisIndex(client, bucket_count=8)
        members = {b: many(12, NOW - b, prefix=f"b{b}") for b in range(8)}
        batch = [(b, m, card(1)) for b, ms in members.items() for m in ms]
        assert index.ensure(batch) == 96
        assert index.alive([(b, m.timer_id, 1, m) for b, m, _ in batch]) == [ALIVE] * 96
        assert index.hints_until(NOW) == [(b, NOW - b) for b in reversed(range(8))]
        assert index.backlog(range(8), NOW, NOW) == {b: 12 for b in range(8)}
        assert index.sweep() == {b: NOW - b for b in range(8)}
        for b, ms in members.items():
            assert index.take_hint(b, NOW - b)
            got = lease(index, "A", bucket=b)
            assert got.members == sorted(ms, key=str)
            assert got.cards == {m.timer_id: card(1) for m in ms}
            assert index.release(b, "A", {ms[0]: NOW + 10}) == 1
            assert lease(index, "B", bucket=b, until=NOW + 10).members == [ms[0]]
            done = [(m, mem(m.timer_id, NOW + 60_000, n=1)) for m in ms]
            assert index.finish(b, "A", NOW, done) == NOW + 60_000
            assert index.finish(b, "B", NOW, done[:1]) == NOW + 60_000
            assert index.members(b) == ([m for _, m in sorted(done, key=lambda d: str(d[1]))], [])
            assert index.replace(b, ms[0].timer_id, 2, None, None)
            assert index.rehint(b) == NOW + 60_000
            assert index.start_run(b, 0, "tok", 5_000)
            assert index.touch_run(b, 0, "tok", 9_000)
            assert index.end_run(b, 0, "tok")
        assert index.hints_until(NOW + 60_000) == [(b, NOW + 10) for b in range(8)]  # never up
        lock = Lock(client, "tq:{fanout}:lock", 60_000)
        assert lock.acquire("me") and lock.renew("me") and lock.release("me")
    finally:
        client.close()
