"""BucketIndex and its Lua scripts (``timers.engine.index``, ``engine/lua/*.lua``) against a real
redis-server: the guarantees the fire path takes from its Redis buckets.

A bucket holds one member per timer: ``due`` (member -> when it may next be leased) and ``data``
(member -> its card), written together by each script. Time is always an argument (``until``,
``lease_end``, scores): nothing here waits for the wall clock.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import ResponseError

from ops.redis_cluster import LocalRedisCluster
from tests.support.clock import T0
from tests.support.real_parts import RedisTarget
from timers.core.schedule import AfterSchedule, AtSchedule, CronSchedule, EverySchedule, Schedule
from timers.core.timer import Status, Timer
from timers.core.webhooks import Webhook
from timers.engine import keys
from timers.engine.entries import path_hash
from timers.engine.index import (
    CHUNK,
    ENDED,
    NOTED,
    SHARD_WAIT_S,
    BucketIndex,
    Card,
    Leased,
    Peek,
    PeekPending,
    member_of,
)
from timers.engine.log import child_key

pytestmark = pytest.mark.integration

NOW = T0
LEASE_END = NOW + 30_000  # where a lease puts a member: its run's deadline and a grace
BUCKETS = 4
DAY = 86_400_000


@pytest.fixture
def index(redis_client: redis.Redis) -> BucketIndex:
    return BucketIndex(redis_client, bucket_count=BUCKETS)


def timer(
    timer_id: str,
    rev: int = 1,
    *,
    tenant: str = "acme",
    partition: int = 0,
    status: Status = "active",
    schedule: Schedule | None = None,
    **fields: Any,
) -> Timer:
    """A timer as a card carries it (the fields a card leaves out at their defaults)."""
    fields.setdefault("payload_json", '{"k":1}')
    return Timer(
        tenant=tenant,
        id=timer_id,
        schedule=schedule or EverySchedule(60),
        anchor_ms=NOW - 60_000,
        target_queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/acme",
        rev=rev,
        partition=partition,
        status=status,
        **fields,
    )


def card(
    timer_id: str,
    pos: int = NOW,
    rev: int = 1,
    *,
    tenant: str = "acme",
    partition: int = 0,
    n: int = 0,
    pv: int | None = None,
    ckpt: int = 0,
) -> Card:
    return Card(timer(timer_id, rev, tenant=tenant, partition=partition), pos, n, pv, ckpt)


def many(n: int, pos: int = NOW, *, tenant: str = "acme", partition: int = 0) -> list[Card]:
    """``n`` timers' cards (timer ids are unique across tenants, as the api makes them)."""
    return [card(f"{tenant}-{i:05d}", pos, tenant=tenant, partition=partition) for i in range(n)]


def lease(
    index: BucketIndex,
    until: int = NOW,
    *,
    bucket: int = 0,
    lease_end: int = LEASE_END,
    limit: int = 100,
    scan: int = 0,
) -> Leased:
    return index.lease(bucket, until, lease_end, limit, scan)


def scores(index: BucketIndex, bucket: int = 0) -> dict[str, int]:
    """member -> its score in ``due``, for members with a card."""
    return {m: s for m, (s, _) in index.cards(bucket).items()}


def stored(index: BucketIndex, bucket: int = 0) -> dict[str, Card]:
    return {m: c for m, (_, c) in index.cards(bucket).items()}


def raw_due(client: redis.Redis, bucket: int = 0) -> dict[str, int]:
    """The whole ``due`` zset, members without a card included."""
    pairs: Any = client.zrange(keys.due(bucket), 0, -1, withscores=True)
    return {_text(m): int(s) for m, s in pairs}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def members(cards: Sequence[Card]) -> list[str]:
    return [c.member for c in cards]


# ---------------------------------------------------------------- the card


CARDS = {
    "plain": card("tmr_a", NOW, 3, n=7, pv=NOW - 60_000, ckpt=NOW - 120_000),
    "first position": card("tmr_b", NOW, 1),  # no position before it: pv empty
    "bars in every text": Card(
        timer("tmr_c", name="a|b||c", payload_json='{"x":"|1|2|3|","y":["|"]}'), NOW, 2, NOW - 5
    ),
    "non-ASCII": Card(
        timer("tmr_d", tenant="globex", name="Zürich 東京 🚀", payload_json='"ü\\u00e9 🚀 東京"'),
        NOW,
    ),
    "webhook": Card(
        replace(
            timer("tmr_e", schedule=CronSchedule("0 7 * * 1-5", "Europe/Berlin"), max_fires=9),
            target_queue_url="",
            webhook=Webhook(
                "https://hooks.example.com/a|b?q=ä", (("X-Token", "s3|cr3t"), ("X-Trace", "1"))
            ),
        ),
        NOW,
        4,
        NOW - 86_400_000,
        NOW - 86_400_000,
    ),
    "one-shot, bounded, paused": Card(
        timer(
            "tmr_f",
            9,
            schedule=AtSchedule(NOW + 5_000),
            status="paused",
            misfire="skip",
            start_ms=NOW - 1,
            end_ms=NOW + 10_000,
            partition=4095,
        ),
        NOW + 5_000,
    ),
    "after": Card(timer("tmr_g", schedule=AfterSchedule(2.5), misfire="fire_all"), NOW + 2_500),
    "a 64 KB payload": Card(
        timer("tmr_h", payload_json=json.dumps({"x": "|ü" * 32_000}, ensure_ascii=False)), NOW
    ),
}


@pytest.mark.parametrize("kind", list(CARDS))
def test_a_card_round_trips_through_its_text(kind: str) -> None:
    c = CARDS[kind]
    text = c.encode()
    pv = "" if c.pv is None else c.pv
    # the scripts read the revision, position and checkpoint by prefix, whatever the JSON holds
    assert text.startswith(f"{c.timer.rev}|{c.pos}|{c.n}|{pv}|{c.ckpt}|{{")
    assert Card.decode(c.member, text) == c
    assert c.member == f"{c.timer.tenant}|{c.timer.id}" == member_of(c.timer.tenant, c.timer.id)


def test_a_card_leaves_out_what_a_fire_does_not_need() -> None:
    """What the timer item derives or keeps for the api (its checkpoint fields, timestamps,
    expiry, the owed flag) is not carried: the card has its own position."""
    full = replace(
        CARDS["plain"].timer,
        next_fire_ms=NOW,
        fire_count=7,
        last_fire_pos=NOW - 60_000,
        created_ms=NOW - 1,
        updated_ms=NOW - 1,
        expires_ms=NOW + 1,
        owed=True,
    )
    back = Card.decode("acme|tmr_a", Card(full, NOW).encode())
    assert back.timer == CARDS["plain"].timer


def test_cards_round_trip_through_redis_with_either_client_decoding(
    redis_url: str, redis_client: redis.Redis
) -> None:
    everything = [replace(c, timer=replace(c.timer, partition=0)) for c in CARDS.values()]
    with redis.Redis.from_url(redis_url, decode_responses=True) as text_client:
        for client in (redis_client, text_client):
            client.flushall()
            index = BucketIndex(client, bucket_count=1)
            assert index.put(everything) == len(everything)
            assert stored(index) == {c.member: c for c in everything}
            got = lease(index, NOW + 5_000)
            assert sorted(got.cards, key=lambda c: c.member) == sorted(
                everything, key=lambda c: c.member
            )
            assert index.revisions([(0, c.member, c.timer.rev) for c in everything]) == [
                (c.timer.rev, c.ckpt) for c in everything
            ]
            index.set_field(0, keys.SENTINEL, "ok")
            assert index.peek([0], NOW) == {0: Peek(LEASE_END, 0, "ok", None, None)}
            assert index.field(0, keys.SENTINEL) == "ok"


# ---------------------------------------------------------------- put


def test_put_stores_each_card_leasable_from_its_position(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    a, b = card("tm-a", NOW + 5, partition=0), card("tm-b", NOW - 5, partition=4)
    c = card("tm-c", NOW, tenant="beta", partition=BUCKETS + 1)  # partition % buckets: 1
    assert index.put([a, b, c]) == 3
    assert index.cards(0) == {a.member: (NOW + 5, a), b.member: (NOW - 5, b)}
    assert index.cards(1) == {c.member: (NOW, c)}
    assert index.put([a, b, c]) == 0  # nothing newer: repeating a put changes nothing
    assert index.put([]) == 0
    assert raw_due(redis_client) == {a.member: NOW + 5, b.member: NOW - 5}


def test_a_newer_revision_or_a_later_position_wins(index: BucketIndex) -> None:
    first = card("tm-1", NOW, 2, ckpt=NOW)
    assert index.put([first]) == 1
    later = card("tm-1", NOW + 60_000, 2, n=1, pv=NOW, ckpt=NOW)  # the chain moved on
    assert index.put([later]) == 1
    assert index.cards(0) == {later.member: (NOW + 60_000, later)}
    # an earlier position of the same revision (a walk from an older checkpoint) loses
    assert index.put([first]) == 0
    assert index.put([replace(later, n=5, ckpt=NOW + 1)]) == 0  # same position: kept as it is
    assert stored(index) == {later.member: later}
    # a newer revision wins wherever it stands; an older one never comes back
    changed = card("tm-1", NOW + 30_000, 3, ckpt=NOW + 30_000)
    assert index.put([changed]) == 1
    assert index.cards(0) == {changed.member: (NOW + 30_000, changed)}
    assert index.put([later, card("tm-1", NOW + 90_000, 2)]) == 0
    assert index.cards(0) == {changed.member: (NOW + 30_000, changed)}


def test_a_newer_card_is_leasable_at_once_unless_it_keeps_the_lease(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    """A change's card (a newer revision) is leasable from its position at once, even where the
    old card is leased or deferred: a run holding the old one meets the change's fence and claims
    nothing, and the claim, not the lease, keeps two runs from firing one position. Only a
    change adopted by a claimed fire keeps the lease (``keep_lease``): that fire's run sends it
    and chains the new revision."""
    leased, deferred = card("tm-1", NOW), card("tm-2", NOW)
    index.put([leased, deferred])
    assert members(lease(index).cards) == [leased.member, deferred.member]
    index.release(0, {deferred: NOW + 5_000})
    new_leased, new_deferred = card("tm-1", NOW, 2), card("tm-2", NOW, 2)
    assert index.put([new_leased, new_deferred]) == 2
    assert index.cards(0) == {
        leased.member: (NOW, new_leased),
        deferred.member: (NOW, new_deferred),
    }
    lease(index)
    adopted = card("tm-1", NOW, 3)
    assert index.put([adopted], keep_lease=True) == 1
    assert index.cards(0)[leased.member] == (LEASE_END, adopted)
    moved = card("tm-1", NOW + 100, 3)
    assert index.put([moved]) == 1
    assert scores(index)[moved.member] == NOW + 100
    # a card whose due entry is missing (as a script never leaves it) gets one back
    redis_client.zrem(keys.due(0), deferred.member)
    assert index.put([card("tm-2", NOW, 3)]) == 1
    assert scores(index)[deferred.member] == NOW


def test_drop_removes_a_card_unless_a_revision_no_older_is_stored(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    c, other = card("tm-1", NOW, 2), card("tm-2", NOW)
    index.put([c, other])
    index.drop(0, c.member, 1)  # a change older than the card (its Redis write came late)
    index.drop(0, c.member, 2)  # the card's own revision: the card is no older
    assert stored(index) == {c.member: c, other.member: other}
    assert members(lease(index).cards) == [c.member, other.member]
    index.drop(0, c.member, 3)  # paused or deleted at revision 3: the card leaves, leased or not
    assert stored(index) == {other.member: other}
    assert raw_due(redis_client) == {other.member: LEASE_END}
    index.drop(0, c.member, 4)  # nothing there: nothing happens
    index.drop(0, "acme|never", 1)
    assert stored(index) == {other.member: other}
    # a drop leaves nothing behind (a card that comes later, even a stale one, is stored: the
    # change's fence in the fire log stops a stale card from claiming, R2)
    assert index.put([card("tm-1", NOW, 3)]) == 1
    assert raw_due(redis_client) == {other.member: LEASE_END, c.member: NOW}


def test_put_chunks_a_big_batch_and_keeps_every_card(index: BucketIndex) -> None:
    n = CHUNK * 2 + 7
    first, second = many(n), many(5, NOW - 10, tenant="beta", partition=1)
    # one timer twice in one batch, in different chunks: the newer revision wins either way
    old, new = card("tm-twice", NOW, 1), card("tm-twice", NOW + 1, 2)
    back, forth = card("tm-back", NOW + 1, 2), card("tm-back", NOW, 1)
    batch = [old, back, *first[:CHUNK], new, forth, *first[CHUNK:], *second]
    assert index.put(batch) == n + 2 + 1 + 5  # old, then new, stored; forth refused
    assert scores(index) == {c.member: c.pos for c in [*first, new, back]}
    assert scores(index, 1) == {c.member: c.pos for c in second}


# ---------------------------------------------------------------- lease


def test_lease_takes_what_is_leasable_by_until_oldest_first_within_the_limit(
    index: BucketIndex,
) -> None:
    late, early, mid = card("late", NOW), card("early", NOW - 5_000), card("mid", NOW - 10)
    future = card("future", NOW + 1)
    index.put([late, early, mid, future])

    first = lease(index, limit=2)
    assert first == Leased([early, mid], NOW)
    assert lease(index) == Leased([late], NOW + 1)  # due exactly at until counts
    assert lease(index) == Leased([], NOW + 1)  # never what is not leasable yet
    assert lease(index, NOW + 250) == Leased([future], LEASE_END)  # a run leases ARM_MS ahead
    assert scores(index) == {c.member: LEASE_END for c in [late, early, mid, future]}
    assert lease(index, NOW + 250, limit=0) == Leased([], LEASE_END)


def test_a_lease_is_a_later_score_and_a_dead_runs_members_come_back(index: BucketIndex) -> None:
    c = card("tm-1", NOW - 7)
    index.put([c])
    assert lease(index, lease_end=NOW + 1_000) == Leased([c], NOW + 1_000)
    assert scores(index) == {c.member: NOW + 1_000}  # the card stays; only its score moved
    assert lease(index, NOW + 999) == Leased([], NOW + 1_000)  # still leased
    # its run died: at the lease's end the member is leasable again, card and all
    again = lease(index, NOW + 1_000, lease_end=NOW + 40_000)
    assert again == Leased([c], NOW + 40_000)
    assert stored(index) == {c.member: c}


def test_a_member_without_a_card_is_dropped_by_a_lease(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    kept = card("tm-kept", NOW)
    index.put([kept])
    redis_client.zadd(keys.due(0), {"acme|tm-orphan": NOW - 1, "acme|tm-later": NOW + 50})
    assert lease(index) == Leased([kept], NOW + 50)  # nothing to fire: gone from due
    assert raw_due(redis_client) == {kept.member: LEASE_END, "acme|tm-later": NOW + 50}
    assert lease(index, NOW + 50) == Leased([], LEASE_END)
    assert raw_due(redis_client) == {kept.member: LEASE_END}


def test_a_lease_is_fair_across_tenants(index: BucketIndex) -> None:
    """When more are leasable than a lease takes, it takes them round-robin across tenants:
    one tenant's burst never keeps another's timer waiting behind it."""
    # Same score: Redis orders them by member, so all of acme's come before zeta's.
    burst = many(39, tenant="acme")
    lone = card("tm-lone", tenant="zeta")
    index.put([*burst, lone])
    first = lease(index, limit=10)
    assert first.cards == [burst[0], lone, *burst[1:9]]  # one of each tenant per round

    index.put(many(6, NOW - 1, tenant="beta") + many(2, NOW - 1, tenant="gamma"))
    got = lease(index, limit=9).cards  # newcomers join the round in progress
    assert Counter(c.timer.tenant for c in got) == {"acme": 4, "beta": 3, "gamma": 2}

    # the rest, in rounds too: a round takes one of each tenant that has any left
    rest = lease(index, limit=1_000).cards
    assert [Counter(c.timer.tenant for c in rest[i : i + 2]) for i in (0, 2, 4)] == [
        {"acme": 1, "beta": 1}
    ] * 3
    assert Counter(c.timer.tenant for c in rest) == {"acme": 26, "beta": 3}
    assert len(first.cards) + len(got) + len(rest) == 40 + 8

    # nothing queued and everything leasable in view: due order, whatever the tenants
    later = many(3, NOW + 5, tenant="zeta") + many(2, NOW + 3, tenant="acme")
    index.put(later)
    assert lease(index, NOW + 5, limit=10).cards == sorted(later, key=lambda c: (c.pos, c.member))


def test_a_crowd_of_any_size_never_hides_another_tenant(index: BucketIndex) -> None:
    """A lease looks at a bounded number of candidates (``scan``); whatever lies behind them
    is queued fairly (start-time fair queuing), so a tenant whose name sorts last, due with or
    just after another tenant's crowd of any size, goes out in the first lease."""
    crowd = many(3_000, tenant="acme")
    lone = card("tm-lone", tenant="zeta")  # sorts after every one of acme's
    index.put([*crowd, lone])
    assert lone in lease(index, limit=10).cards

    # due a millisecond after the crowd, while the crowd drains: the next lease takes it
    late = card("tm-late", NOW + 1, tenant="zeta")
    index.put([late])
    assert lease(index, NOW + 1, limit=10).cards[:2] == [crowd[9], late]

    # many crowding tenants: one more tenant still gets a place in the first round
    index.put([c for t in ("beta", "gamma", "delta") for c in many(500, NOW + 2, tenant=t)])
    newcomer = card("tm-new", NOW + 2, tenant="zz-top")
    index.put([newcomer])
    first_round = lease(index, NOW + 2, limit=5).cards
    assert {c.timer.tenant for c in first_round} == {"acme", "beta", "gamma", "delta", "zz-top"}

    # every member is leased exactly once, crowd and all
    leased = [*first_round]
    while batch := lease(index, NOW + 2, limit=97).cards:
        leased += batch
    assert len(leased) + 10 + 10 == 3_000 + 1 + 1 + 1_500 + 1


def test_a_crowd_is_queued_a_bounded_slice_a_lease(index: BucketIndex) -> None:
    """A lease queues at most ``admit`` members (a few ms of Redis a call): a tenant due behind
    a crowd bigger than that is queued - and leased - within one lease per ``admit`` members
    due before it."""
    crowd = many(1_000, tenant="acme")
    lone = card("tm-lone", tenant="zeta")
    index.put([*crowd, lone])
    found = [lone in index.lease(0, NOW, LEASE_END, 10, admit=300).cards for _ in range(4)]
    assert found == [False, False, False, True]


def test_interleaved_leasers_get_disjoint_cards_covering_everything_once(
    index: BucketIndex,
) -> None:
    due = many(25) + many(7, NOW - 3, tenant="beta")
    index.put(due + many(5, NOW + 60_000, tenant="later"))
    got: dict[str, list[str]] = {"A": [], "B": []}
    while True:
        a = members(lease(index, limit=3).cards)
        b = members(lease(index, limit=4).cards)
        if not a and not b:
            break
        got["A"] += a
        got["B"] += b
    assert not set(got["A"]) & set(got["B"])
    assert sorted(got["A"] + got["B"]) == sorted(members(due))


def test_concurrent_threads_split_a_big_bucket_exactly(index: BucketIndex) -> None:
    due = many(1_500) + many(500, tenant="beta")
    index.put(due)
    threads = 8
    start = threading.Barrier(threads)
    got: list[list[str]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        start.wait()
        while batch := lease(index, limit=37).cards:
            got[t] += members(batch)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()

    everyone = [m for batch in got for m in batch]
    assert len(everyone) == len(set(everyone)) == 2_000  # pairwise disjoint
    assert set(everyone) == set(members(due))
    assert set(scores(index).values()) == {LEASE_END}


LEASER = """
import json, sys
import redis
from timers.engine.index import BucketIndex
url, until, lease_end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = redis.Redis.from_url(url)
index = BucketIndex(client, bucket_count=4)
client.blpop(["go"])  # every process starts when the test says so
got = []
while batch := index.lease(0, until, lease_end, 23).cards:
    got += [c.member for c in batch]
print(json.dumps(got))
"""


def test_concurrent_processes_split_a_big_bucket_exactly(
    index: BucketIndex, redis_client: redis.Redis, redis_url: str
) -> None:
    due = many(1_200) + many(300, tenant="beta")
    index.put(due)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LEASER, redis_url, str(NOW), str(LEASE_END)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    redis_client.rpush("go", *["go"] * len(procs))
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(procs)
    everyone = [m for out in outputs for m in json.loads(out)]
    assert len(everyone) == len(set(everyone)) == 1_500
    assert set(everyone) == set(members(due))


def test_bad_buckets_are_refused(index: BucketIndex) -> None:
    for bad in (-1, BUCKETS):
        with pytest.raises(ValueError):
            lease(index, bucket=bad)
        with pytest.raises(ValueError):
            index.settle(bad, [(card("tm-1"), None, 1)])
        with pytest.raises(ValueError):
            index.peek([bad], NOW)
    with pytest.raises(ValueError):
        BucketIndex(redis.Redis(), bucket_count=0)


# ---------------------------------------------------------------- settle


def test_settle_chains_the_next_card_or_drops_it(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    chained, done, other = card("tm-1", NOW, ckpt=NOW), card("tm-2", NOW), card("tm-3", NOW + 9)
    index.put([chained, done, other])
    assert lease(index).cards == [chained, done]
    following = chained.at(NOW + 60_000, 1, NOW)
    assert index.settle(0, [(chained, following, 1), (done, None, 1)]) == NOW + 9
    assert index.cards(0) == {
        chained.member: (NOW + 60_000, following),
        other.member: (NOW + 9, other),
    }
    assert stored(index)[chained.member].ckpt == NOW  # Card.at keeps the checkpoint
    assert raw_due(redis_client) == {chained.member: NOW + 60_000, other.member: NOW + 9}
    assert index.settle(0, []) is None


def test_settle_acts_only_on_the_card_still_at_the_leased_position(index: BucketIndex) -> None:
    """A restore (or another run's chain) moved the card on since the lease: the late settle
    of the old position neither chains nor drops it."""
    c = card("tm-1", NOW)
    index.put([c])
    (leased,) = lease(index).cards
    moved = card("tm-1", NOW + 60_000, n=1, pv=NOW)
    assert index.put([moved]) == 1
    assert index.settle(0, [(leased, leased.at(NOW + 1_000, 1, NOW), 1)]) == NOW + 60_000
    assert index.settle(0, [(leased, None, 1)]) == NOW + 60_000
    assert index.cards(0) == {c.member: (NOW + 60_000, moved)}


def test_settle_never_acts_over_a_newer_revision(index: BucketIndex) -> None:
    """A change (revision 2) replaced the card at the leased position: the lease's run, knowing
    revision 1, neither drops it nor chains revision 1 on. A run whose claim the change adopted
    knows revision 2 (its entry's): it chains the change's card."""
    c = card("tm-1", NOW)
    index.put([c])
    (leased,) = lease(index).cards
    changed = card("tm-1", NOW, 2)
    assert index.put([changed]) == 1
    stale_next = leased.at(NOW + 60_000, 1, NOW)
    index.settle(0, [(leased, None, 1)])
    index.settle(0, [(leased, stale_next, 1)])
    assert stored(index) == {c.member: changed}
    adopted_next = Card(changed.timer, NOW + 90_000, 1, NOW)
    assert index.settle(0, [(leased, adopted_next, 2)]) == NOW + 90_000
    assert index.cards(0) == {c.member: (NOW + 90_000, adopted_next)}


def test_a_change_at_the_leased_position_is_leasable_while_the_stale_card_is_settled(
    index: BucketIndex,
) -> None:
    """A run leased the card; a change that keeps the position (a new payload) puts its own
    card, leasable at once (docs/fire-path.md: a card Redis holds at p is leased within
    LEAD_MS of its due time); the first run, its claim refused by the change's fence, drops its
    stale card - which leaves the newer card where it is."""
    c = card("tm-1", NOW)
    index.put([c])
    (leased,) = lease(index).cards
    changed = card("tm-1", NOW, 2)
    assert index.put([changed]) == 1
    assert index.settle(0, [(leased, None, 1)]) == NOW  # no newer card is dropped
    assert lease(index, lease_end=NOW + 60_000).cards == [changed]


def test_a_windowed_crowd_is_leased_in_the_order_its_claim_items_fill(
    index: BucketIndex,
) -> None:
    """An aligned instant's crowd goes out lease by lease in the order of its fire-log path (the
    digits that place entries below sealed claim items): consecutive leases fill one claim item
    after another instead of adding a few entries to each of them. The order is a fraction of
    a millisecond on the score: never leasable before the send instant, at most 1 ms after."""
    windowed = [Card(replace(c.timer, window_ms=60_000, grain_ms=30_000), c.pos) for c in many(300)]
    send = windowed[0].due_at
    assert {c.due_at for c in windowed} == {send} and send > NOW
    index.put(windowed)
    assert all(send <= c.score < send + 1 for c in windowed)
    head = math.ceil(min(c.score for c in windowed))  # never announced before it is leasable
    assert lease(index, send - 1) == Leased([], head)
    taken = [c for _ in range(4) for c in lease(index, send + 1).cards]
    assert len(taken) == 300
    paths = [path_hash(c.timer.id)[:2] for c in taken]
    assert paths == sorted(paths), "leased out of the claim items' order"
    assert child_key("7/1764400000", f"{taken[0].timer.id}@0").endswith("/" + paths[0][0])
    sole = card("sole", send)  # on the dot: its score is its send instant, to the ms
    index.put([replace(sole, timer=replace(sole.timer, window_ms=0))])
    assert scores(index)[sole.member] == send and lease(index, send).cards == [sole]


@pytest.mark.parametrize("base", [NOW, NOW + 123_457, 2**41 + 1, 9_000_000_000_001])
def test_every_fraction_of_a_windowed_score_is_stored_exactly(
    index: BucketIndex, redis_client: redis.Redis, base: int
) -> None:
    """Each of the 256 fractions, through put and settle, up to the ended-chain notes' 10^13:
    Redis holds the send instant + k/256 exactly (never below the send instant, never rounded
    to the next ms); a lease by the send instant takes only k = 0, one by the next ms all."""
    by_fraction: dict[int, str] = {}
    for i in range(100_000):
        by_fraction.setdefault(int(path_hash(f"tmr_{i:06d}")[:2], 16), f"tmr_{i:06d}")
        if len(by_fraction) == 256:
            break
    cards = [
        Card(replace(card(by_fraction[k], base).timer, window_ms=60_000, grain_ms=30_000), base)
        for k in range(256)
    ]
    send = cards[0].due_at

    def exact() -> None:
        for k, c in enumerate(cards):
            assert float(redis_client.zscore(keys.due(0), c.member)) == send + k / 256, k

    index.put(cards)
    exact()
    assert lease(index, send, lease_end=send + 100_000).cards == cards[:1]
    assert len(lease(index, send + 1, lease_end=send + 100_000, limit=300).cards) == 255
    assert index.settle(0, [(c, c.at(c.pos + 1, 1, c.pos), 1) for c in cards]) == send
    exact()
    short = replace(cards[1], timer=replace(cards[1].timer, window_ms=500, grain_ms=0))
    assert short.score == short.due_at == base  # a window under 1 s is on the dot: no fraction


def test_settle_returns_the_earliest_score(index: BucketIndex) -> None:
    a, b, c = card("a", NOW), card("b", NOW + 70), card("c", NOW + 50)
    index.put([a, b, c])
    lease(index)
    assert index.settle(0, [(a, a.at(NOW + 20, 1, NOW), 1)]) == NOW + 20
    lease(index, NOW + 100, lease_end=NOW + 5_000)
    assert scores(index) == {a.member: NOW + 5_000, b.member: NOW + 5_000, c.member: NOW + 5_000}
    moved_a = stored(index)[a.member]
    assert index.settle(0, [(moved_a, None, 1), (b, None, 1), (c, None, 1)]) is None  # empty


# ---------------------------------------------------------------- release


def test_release_makes_leased_cards_leasable_again_from_their_score(index: BucketIndex) -> None:
    c1, c2 = card("tm-1", NOW - 2), card("tm-2", NOW - 1)
    index.put([c1, c2])
    assert lease(index).cards == [c1, c2]
    # a deferral (another run's live claim lapses then) keeps the card
    assert index.release(0, {c1: NOW + 5_000}) == NOW + 5_000
    assert index.cards(0) == {c1.member: (NOW + 5_000, c1), c2.member: (LEASE_END, c2)}
    assert lease(index, NOW + 4_999).cards == []
    assert lease(index, NOW + 5_000).cards == [c1]
    # a hand-back: leasable at its position, at once, with no lease end to wait for
    assert index.release(0, {c2: c2.pos}) == c2.pos
    assert lease(index).cards == [c2]
    assert index.release(0, {}) is None


def test_release_acts_only_on_the_card_still_at_the_leased_position(index: BucketIndex) -> None:
    c = card("tm-1", NOW)
    index.put([c])
    (leased,) = lease(index).cards
    moved = card("tm-1", NOW + 60_000, n=1, pv=NOW)
    index.put([moved])
    assert index.release(0, {leased: NOW}) == NOW + 60_000
    assert index.cards(0) == {c.member: (NOW + 60_000, moved)}
    index.drop(0, c.member, 2)
    assert index.release(0, {leased: NOW}) is None  # gone: a release puts nothing back
    assert index.cards(0) == {}


# ---------------------------------------------------------------- the fan-out's peek


def test_peek_reads_each_buckets_head_backlog_sentinel_and_warmth(index: BucketIndex) -> None:
    index.put([card("a", NOW - 1), card("b", NOW + 150), card("c", NOW + 201)])  # bucket 0
    index.put([card(x, NOW, partition=1) for x in ("d", "e", "f")])
    index.lease(1, NOW, NOW + 500, 1)  # bucket 1: one leased until NOW + 500
    index.lease(1, NOW, NOW + 10_000, 1)  # and one until NOW + 10 s
    index.set_field(1, keys.SENTINEL, "ok")
    index.set_field(1, keys.RAN, NOW - 30_000)
    index.set_field(1, keys.COLD, 420)
    index.set_field(3, keys.SENTINEL, f"r{NOW}")  # bucket 3: empty, restoring
    assert index.peek(range(BUCKETS), NOW + 200) == {
        0: Peek(NOW - 1, 2, None, None, None),
        1: Peek(NOW, 1, "ok", NOW - 30_000, 420),
        2: Peek(None, 0, None, None, None),
        3: Peek(None, 0, f"r{NOW}", None, None),
    }
    # a lease that ended is due work again: it counts, and it may be the head
    assert index.peek([1], NOW + 500) == {1: Peek(NOW, 2, "ok", NOW - 30_000, 420)}
    index.lease(1, NOW, NOW + 10_000, 1)
    assert index.peek([1], NOW + 500)[1] == Peek(NOW + 500, 1, "ok", NOW - 30_000, 420)
    assert index.peek([0], NOW + 201)[0] == Peek(NOW - 1, 3, None, None, None)
    assert index.peek([], NOW) == {}


def test_peek_answers_a_failing_buckets_error_in_place(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    index.put([card("a", NOW), card("b", NOW, partition=3)])
    redis_client.set(keys.due(2), "not a zset")  # this bucket's every call fails
    got = index.peek(range(BUCKETS), NOW)
    assert isinstance(got[2], ResponseError) and "WRONGTYPE" in str(got[2])
    assert {b: p for b, p in got.items() if b != 2} == {
        0: Peek(NOW, 1, None, None, None),
        1: Peek(None, 0, None, None, None),
        3: Peek(NOW, 1, None, None, None),
    }
    (alone,) = index.peek([2], NOW).values()  # a single bucket's error is answered too
    assert isinstance(alone, ResponseError)


# ---------------------------------------------------------------- the migrator's questions


def test_revisions_answers_each_members_revision_and_checkpoint(index: BucketIndex) -> None:
    index.put([card("a", NOW, 3, ckpt=NOW - 9), card("b", NOW, 1, partition=1)])
    index.put([card("c", NOW, 7, ckpt=NOW + 5, tenant="beta", partition=2)])
    checks = [
        (0, "acme|a", 3),
        (1, "acme|b", 1),
        (2, "beta|c", 9),  # asked of a newer revision than Redis holds: Redis says what it holds
        (0, "acme|never", 1),
        (1, "acme|a", 3),  # the wrong bucket knows nothing of it
        (4, "acme|a", 3),  # partition 4 lives in bucket 0
    ]
    expected = [(3, NOW - 9), (1, 0), (7, NOW + 5), (-1, -1), (-1, -1), (3, NOW - 9)]
    assert index.revisions(checks) == expected
    # more than a script call takes, interleaved across buckets: answers in the order asked
    big = checks * (CHUNK // 2)
    assert index.revisions(big) == expected * (CHUNK // 2)
    assert index.revisions([]) == []


def test_a_chain_ended_by_settle_is_answered_for_its_revision_only_until_forgotten(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    """A run that finishes a timer's last position notes it: the migrator learns that the
    revision's listings are dead from Redis. Never for another revision, never over a card."""
    ended, chained, other = card("a", NOW, 2), card("b", NOW, 1), card("c", NOW, 1)
    index.put([ended, chained, other])
    index.settle(0, [(ended, None, 2), (chained, chained.at(NOW + 60_000, 1, NOW), 1),
                     (other, None, 1)], ended={ended.member}, now=NOW)  # fmt: skip
    asked = [(0, ended.member, 2), (0, ended.member, 3), (0, chained.member, 1),
             (0, other.member, 1)]  # fmt: skip
    assert index.revisions(asked) == [(2, ENDED), (-1, -1), (1, 0), (-1, -1)]
    index.put([card("a", NOW + 5_000, 3)])  # a change since: the card answers, not the note
    assert index.revisions(asked[:2]) == [(3, 0), (3, 0)]
    notes = redis_client.zrangebyscore(keys.due(0), NOTED, "+inf", withscores=True)
    assert notes == [(b"acme|a|2", NOTED + NOW)]
    assert index.peek([0], NOW + DAY)[0] == Peek(NOW + 5_000, 2, None, None, None)  # not a note
    assert {c.member for c in lease(index, NOW + DAY).cards} == {ended.member, chained.member}
    index.forget_ended(0, ["acme|a|2"], NOW - DAY)
    assert redis_client.zrangebyscore(keys.due(0), NOTED, "+inf") == []
    stale = card("d", NOW, 1)
    index.put([stale])
    index.settle(0, [(stale, None, 1)], ended={stale.member}, now=NOW - DAY - 1)
    index.forget_ended(0, [], NOW - DAY)  # a note older than the retention: nobody will ask
    assert redis_client.zrangebyscore(keys.due(0), NOTED, "+inf") == []


# ---------------------------------------------------------------- run markers and fields


def test_run_markers_are_set_once_and_touched_or_ended_by_their_token(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    key = keys.run(2, 0)
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
    assert redis_client.exists(key) == 0
    assert index.start_run(2, 0, "fan-2", 5_000)
    redis_client.pexpireat(key, 1)  # expired (its invoke never ran): the next one may start
    assert not index.touch_run(2, 0, "fan-2", 60_000)
    assert index.start_run(2, 0, "fan-3", 5_000)


def test_swap_field_sets_a_field_only_over_what_it_expects(index: BucketIndex) -> None:
    assert index.field(1, keys.SENTINEL) is None
    assert index.swap_field(1, keys.SENTINEL, None, f"r{NOW}")  # absent: one fan-out wins
    assert not index.swap_field(1, keys.SENTINEL, None, f"r{NOW + 1}")  # the other loses
    assert index.field(1, keys.SENTINEL) == f"r{NOW}"
    assert not index.swap_field(1, keys.SENTINEL, "ok", f"r{NOW + 1}")
    assert index.swap_field(1, keys.SENTINEL, f"r{NOW}", "ok")  # the restore is done
    assert not index.swap_field(1, keys.SENTINEL, f"r{NOW}", "ok")  # only once
    assert index.field(1, keys.SENTINEL) == "ok"
    assert index.field(0, keys.SENTINEL) is None  # per bucket
    index.set_field(1, keys.RAN, NOW)
    assert index.field(1, keys.RAN) == str(NOW)
    # a bucket's own fields are no members: a lease or revisions never see them
    index.put([card("a", NOW, partition=1)])
    assert members(index.lease(1, NOW, LEASE_END, 10).cards) == ["acme|a"]
    assert index.peek([1], LEASE_END)[1] == Peek(LEASE_END, 1, "ok", NOW, None)


# ---------------------------------------------------------------- Redis losing state


def test_scripts_work_again_after_script_flush(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    """A failover to a node that never saw the scripts: EVALSHA meets NOSCRIPT, single or
    pipelined, and each call is made again through the script, which loads it."""
    per_bucket = {b: many(30, NOW - b, tenant=f"t{b}", partition=b) for b in range(BUCKETS)}
    assert index.put([c for cs in per_bucket.values() for c in cs[:10]]) == 40  # now cached

    def flush() -> None:
        redis_client.script_flush()

    flush()  # one pipeline over four buckets meets NOSCRIPT four times
    assert index.put([c for cs in per_bucket.values() for c in cs]) == 80
    flush()
    assert index.peek(range(BUCKETS), NOW) == {
        b: Peek(NOW - b, 30, None, None, None) for b in range(BUCKETS)
    }
    flush()
    checks = [(b, c.member, 1) for b, cs in per_bucket.items() for c in cs]
    assert index.revisions(checks) == [(1, 0)] * 120
    leased: dict[int, list[Card]] = {}
    for b in range(BUCKETS):
        flush()
        leased[b] = index.lease(b, NOW, LEASE_END, 100).cards
    assert sum(map(len, leased.values())) == 120
    for b, cs in leased.items():
        flush()
        assert index.release(b, {c: c.pos for c in cs[:5]}) == NOW - b
        flush()
        assert index.settle(b, [(c, None, 1) for c in cs[5:]]) == NOW - b
    flush()
    index.drop(0, per_bucket[0][0].member, 2)
    flush()
    assert index.swap_field(0, keys.SENTINEL, None, "ok")
    flush()
    assert index.start_run(0, 0, "tok", 5_000)
    assert index.touch_run(0, 0, "tok", 9_000)
    flush()
    assert index.end_run(0, 0, "tok")
    assert {b: len(index.cards(b)) for b in range(BUCKETS)} == {0: 4, 1: 5, 2: 5, 3: 5}


def test_a_flush_empties_the_index_and_a_run_that_outlived_it_puts_nothing_back(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    cards = many(3)
    index.put(cards)
    first, second, _ = lease(index, limit=3).cards
    redis_client.flushall()  # a failover to an empty replica
    assert index.peek([0], LEASE_END) == {0: Peek(None, 0, None, None, None)}  # no sentinel
    assert lease(index, LEASE_END) == Leased([], None)
    assert index.revisions([(0, c.member, 1) for c in cards]) == [(-1, -1)] * 3
    # the run that leased before the flush goes on: its chain, drop and release add nothing
    assert index.settle(0, [(first, first.at(NOW + 60_000, 1, NOW), 1)]) is None
    assert index.settle(0, [(second, None, 1)]) is None
    assert index.release(0, {second: NOW}) is None
    assert index.cards(0) == {}
    assert index.put(cards) == 3  # the migrator restores the bucket
    assert scores(index) == {c.member: NOW for c in cards}


# ---------------------------------------------------------------- round trips and commands


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


def round_trips(call: Any) -> int:
    CountingConnection.sent = 0
    call()
    return CountingConnection.sent


def test_many_buckets_cost_one_round_trip_per_call(counting_client: redis.Redis) -> None:
    index = BucketIndex(counting_client, bucket_count=16)
    batch = [c for b in range(16) for c in many(20, NOW + b, tenant=f"t{b}", partition=b)]
    assert index.put(batch[:16]) == 16  # loads the script (cold cache)
    index.peek([0], NOW)  # and this one
    assert round_trips(lambda: index.put(batch)) == 1  # every bucket's script in one pipeline
    peeks: dict[int, Peek | Exception] = {}
    assert round_trips(lambda: index.peek(range(16), NOW - 100)) == 1  # nothing due yet
    assert round_trips(lambda: peeks.update(index.peek(range(16), NOW + 100))) == 2  # + backlogs
    assert peeks == {b: Peek(NOW + b, 20, None, None, None) for b in range(16)}
    leased: list[Card] = []
    assert round_trips(lambda: leased.extend(index.lease(3, NOW + 3, LEASE_END, 100).cards)) == 1
    assert len(leased) == 20
    moves = [(c, c.at(NOW + 60_000, 1, c.pos), 1) for c in leased]
    assert round_trips(lambda: index.settle(3, moves)) == 1
    assert round_trips(lambda: index.release(3, {c: NOW for c in leased})) == 1
    one_bucket = [(4, c.member, 1) for c in batch if c.timer.partition == 4]
    assert round_trips(lambda: index.revisions(one_bucket * 25)) == 1  # 500: one script call


def commands(client: redis.Redis, call: Any) -> Counter[str]:
    """The commands the server ran for ``call``, those run by its scripts included."""
    client.config_resetstat()
    call()
    stats: Any = client.info("commandstats")
    ran = Counter({k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()})
    ran.pop("config", None)
    return ran


def test_a_fire_costs_a_few_redis_commands_and_a_call_bounded_work(
    index: BucketIndex, redis_client: redis.Redis
) -> None:
    """Per lease and per settle of k cards a fixed handful of commands; and a batch of any
    size is cut into script calls of CHUNK members, sent in one round trip."""
    index.put(many(300))
    warm = card("warm", partition=1)  # the scripts loaded (a cold cache: a SCRIPT LOAD once)
    index.put([warm])
    lease(index, bucket=1)
    index.settle(1, [(warm, None, 1)])
    settle = Counter(evalsha=1, hmget=1, hset=1, zadd=1, zrangebyscore=1)
    lease_once = Counter(evalsha=1, hmget=1, zadd=1)  # the cards read, their leases written
    fresh_queue = Counter({"zrangebyscore": 4, "zmscore": 1, "zadd": 2, "del": 1, "hset": 1})
    steps = [  # (limit, leased, what it meets, the commands of its look, queue and head)
        (100, 100, "all 300 in view: round-robin", Counter(zrangebyscore=3)),
        (1, 1, "a crowd behind the look: queued", fresh_queue),
        (100, 100, "the queue: its head is V", Counter(zrangebyscore=2)),
        (100, 99, "the queue's last 99: it ends", Counter({"zrangebyscore": 3, "del": 1})),
    ]
    for k, n, meets, looks in steps:
        got: list[Leased] = []
        ran = commands(redis_client, lambda k=k, got=got: got.append(lease(index, limit=k)))
        (leased,) = got
        assert len(leased.cards) == n, meets
        assert ran == lease_once + looks, meets
        moves = [(c, c.at(NOW + 60_000, 1, c.pos), 1) for c in leased.cards]
        ran = commands(redis_client, lambda moves=moves: index.settle(0, moves))
        assert ran == settle

    big = many(2 * CHUNK + 1, NOW + 1, tenant="big")
    ran = commands(redis_client, lambda: index.put(big))
    assert ran["evalsha"] == 3  # 500 + 500 + 1
    everything = lease(index, NOW + 1, limit=2 * CHUNK + 1).cards
    assert len(everything) == 2 * CHUNK + 1
    ran = commands(redis_client, lambda: index.settle(0, [(c, None, 1) for c in everything]))
    assert (ran["evalsha"], ran["hdel"], ran["zrem"]) == (3, 3, 3)  # one of each per call


# ---------------------------------------------------------------- cluster mode


def test_every_key_of_a_bucket_shares_one_slot_and_buckets_spread() -> None:
    slots: list[int] = []
    for b in range(256):
        names = [keys.due(b), keys.data(b), keys.run(b, 0), keys.run(b, 7)]
        assert all(k.startswith(f"{keys.PREFIX}:{{b{b}}}:") for k in names)
        bucket_slots = {key_slot(k.encode()) for k in names}
        assert len(bucket_slots) == 1
        slots += bucket_slots
    assert len(set(slots)) > 200  # spread over the cluster, not one hot slot


def exercise(index: BucketIndex, buckets: int) -> None:
    """Every operation of the index (so every script), on every bucket."""
    per_bucket = {b: many(12, NOW - b, tenant=f"t{b}", partition=b) for b in range(buckets)}
    every = [c for cs in per_bucket.values() for c in cs]
    assert index.put(every) == 12 * buckets
    revisions = index.revisions([(c.timer.partition, c.member, 1) for c in every])
    assert revisions == [(1, 0)] * len(every)
    assert index.peek(range(buckets), NOW) == {
        b: Peek(NOW - b, 12, None, None, None) for b in range(buckets)
    }
    for b, cs in per_bucket.items():
        assert index.swap_field(b, keys.SENTINEL, None, "ok")
        index.set_field(b, keys.RAN, NOW)
        assert index.field(b, keys.SENTINEL) == "ok"
        got = index.lease(b, NOW, LEASE_END, 100)
        assert got == Leased(cs, LEASE_END)
        assert index.release(b, {cs[0]: NOW + 10}) == NOW + 10
        assert index.lease(b, NOW + 10, LEASE_END, 100).cards == [cs[0]]
        moves = [(c, c.at(NOW + 60_000, 1, c.pos), 1) for c in cs[1:]]
        assert index.settle(b, [*moves, (cs[0], None, 1)]) == NOW + 60_000
        assert scores(index, b) == {c.member: NOW + 60_000 for c in cs[1:]}
        index.drop(b, cs[1].member, 2)
        assert index.start_run(b, 0, "tok", 5_000)
        assert index.touch_run(b, 0, "tok", 9_000)
        assert index.end_run(b, 0, "tok")


@pytest.mark.parametrize("client_class", [redis.RedisCluster, redis.Redis])
def test_every_operation_runs_on_a_cluster_mode_server(
    redis_cluster_url: str, client_class: type[redis.Redis] | type[redis.RedisCluster]
) -> None:
    """The node refuses CROSSSLOT commands and scripts, and RedisCluster routes each call (and
    each command of a pipeline) by its keys' slot, refusing scripts whose keys span slots."""
    client: Any = client_class.from_url(redis_cluster_url)
    try:
        client.flushall()
        client.script_flush()  # the first calls meet NOSCRIPT, pipelined and single
        exercise(BucketIndex(client, bucket_count=8), 8)
    finally:
        client.close()


DATA_COMMANDS = {
    *("GET", "SET", "DEL", "PEXPIRE"),
    *("HGET", "HMGET", "HSET", "HDEL", "HGETALL"),
    *("ZADD", "ZREM", "ZSCORE", "ZRANGE", "ZRANGEBYSCORE", "ZCOUNT"),
}


def test_every_script_touches_the_one_slot_of_its_keys(redis_cluster_url: str) -> None:
    """Redis 6.2 lets a script on a one-node cluster touch keys it did not declare: MONITOR
    shows every command each script ran, and each must touch only its declared keys' slot. And
    no command touches a key outside the buckets (none is shared by all of them)."""
    client: Any = redis.RedisCluster.from_url(redis_cluster_url)
    node = redis.Redis.from_url(redis_cluster_url)
    try:
        client.flushall()
        with node.monitor() as monitor:
            exercise(BucketIndex(client, bucket_count=4), 4)
            node.echo("the end")
            seen: list[dict[str, Any]] = []
            while "the end" not in (entry := monitor.next_command())["command"]:
                seen.append(entry)
    finally:
        client.close()
        node.close()
    scripts = 0
    declared: int | None = None
    for entry in seen:
        words = entry["command"].split(" ")
        command = words[0].upper()
        if entry["client_type"] == "lua":
            assert command in DATA_COMMANDS, entry["command"]  # (a new one: add it there)
        if command in DATA_COMMANDS:  # no key outside the buckets: none shared by all
            assert words[1].startswith(f"{keys.PREFIX}:{{b"), entry["command"]
        if entry["client_type"] != "lua":
            if command in ("EVALSHA", "EVAL"):
                scripts += 1
                slots = {key_slot(k.encode()) for k in words[3 : 3 + int(words[2])]}
                assert len(slots) == 1, entry["command"]
                (declared,) = slots
            continue
        assert declared is not None, entry["command"]  # a script's commands follow its call
        assert key_slot(words[1].encode()) == declared, entry["command"]
    assert scripts >= 8 * 4
    assert sum(entry["client_type"] == "lua" for entry in seen) > 2 * scripts


@pytest.mark.real_parts
def test_a_shard_failing_over_costs_only_its_own_buckets_their_peek(
    redis_cluster: LocalRedisCluster,
) -> None:
    """On a 3-master cluster one dead node fails a whole redis-py pipeline: each shard is
    peeked apart, so while a master is dead (its replica not promoted yet) the other shards'
    buckets answer their peek; a shard paused past SHARD_WAIT_S answers PeekPending, and then
    its peek again."""
    cluster = redis_cluster
    cluster.flush_all()
    client = RedisTarget(cluster.url, cluster=True).client()
    index = BucketIndex(client, bucket_count=16)
    assert index.put([c for b in range(16) for c in many(1, NOW - b, tenant=f"t{b}", partition=b)])
    shard_of = {b: cluster.owner(key_slot(keys.due(b).encode())) for b in range(16)}
    victim = shard_of[0]
    theirs = {b for b, port in shard_of.items() if port == victim}
    others = set(range(16)) - theirs
    assert others, "the buckets spread over the masters"

    with redis.Redis(port=victim) as node:
        node.execute_command("CLIENT", "PAUSE", int(SHARD_WAIT_S * 1000) + 400, "ALL")
    got = index.peek(range(16), NOW)
    assert {b for b, p in got.items() if isinstance(p, PeekPending)} == theirs
    assert all(got[b] == Peek(NOW - b, 1, None, None, None) for b in others)
    deadline = time.monotonic() + 5
    while any(isinstance(p, PeekPending) for p in got.values()) and time.monotonic() < deadline:
        got = index.peek(range(16), NOW)  # the paused shard answers once the pause ends
    assert got == {b: Peek(NOW - b, 1, None, None, None) for b in range(16)}

    cluster.kill(victim)
    try:
        got = index.peek(range(16), NOW)
        deadline = time.monotonic() + 5
        while any(isinstance(p, PeekPending) for p in got.values()) and time.monotonic() < deadline:
            got = index.peek(range(16), NOW)  # an error after SHARD_WAIT_S: the next poll's
        assert all(got[b] == Peek(NOW - b, 1, None, None, None) for b in others)
        assert all(isinstance(got[b], Exception) for b in theirs)
    finally:
        client.close()
        cluster.replace(victim)
        cluster.fail_back()  # the session's cluster as it started (masters first)


class TwoShards:
    """A plain redis-server whose buckets two "nodes" serve, by parity."""

    def __init__(self, real: redis.Redis) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def get_node_from_key(self, key: str) -> Any:
        return type("Node", (), {"name": f"n{int(key.split('{b')[1].split('}')[0]) % 2}"})


def odd_shard_slow(index: BucketIndex, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    peek = index._peek

    def slow_odd(buckets: Sequence[int], until: int) -> Any:
        if 1 in buckets:
            time.sleep(seconds)
        return peek(buckets, until)

    monkeypatch.setattr(index, "_peek", slow_odd)


def test_a_shard_always_slower_than_the_wait_is_still_peeked(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard whose every peek takes longer than SHARD_WAIT_S (a busy node, a far AZ) answers
    PeekPending in one poll and its answer, a poll late, in the next: never pending for ever."""
    index = BucketIndex(TwoShards(redis_client), bucket_count=4)
    assert index.put([c for b in range(4) for c in many(1, NOW - b, tenant=f"t{b}", partition=b)])
    odd_shard_slow(index, monkeypatch, SHARD_WAIT_S * 1.5)
    polls = []
    for _ in range(4):  # polls a wait apart, as the fan-out's are (POLL_MS)
        polls.append(index.peek(range(4), NOW))
        time.sleep(SHARD_WAIT_S)
    assert all(p[0] == Peek(NOW, 1, None, None, None) for p in polls)  # the fast shard each time
    assert isinstance(polls[0][1], PeekPending)
    answered = [p[1] for p in polls if isinstance(p[1], Peek)]
    assert answered and all(a == Peek(NOW - 1, 1, None, None, None) for a in answered)


def test_a_peek_without_a_wait_answers_every_shard_however_slow(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wait_s=None`` (a world on an injected clock, where a poll takes no time): the slow
    shard's buckets answer in the same poll, never PeekPending - or a slow shard would make its
    fires late on that clock by the real time its peeks took."""
    index = BucketIndex(TwoShards(redis_client), bucket_count=4)
    assert index.put([c for b in range(4) for c in many(1, NOW - b, tenant=f"t{b}", partition=b)])
    odd_shard_slow(index, monkeypatch, SHARD_WAIT_S * 3)
    for _ in range(2):
        got = index.peek(range(4), NOW, wait_s=None)
        assert got == {b: Peek(NOW - b, 1, None, None, None) for b in range(4)}
