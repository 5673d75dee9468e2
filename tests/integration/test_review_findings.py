"""An adversarial review of the fire path (``timers.engine``): each test here shows one defect
that loses, duplicates, delays or fires early a timer, or lets a change lose to a stale copy.
Each is a strict xfail until its defect is fixed; the reason says what breaks, the commit that
added it the smallest fix.

- changes win (4): a keyed create in flight overwrites what its retry made (payload, a
  deleted timer back); a delete meeting a claimed fire lets a stale card chain on for ever;
- one per fire (3): a one-shot fired a day late outlives its entry and fires again; a new
  schedule reuses a catch-up's fire id; a run meeting its own claim again sends twice;
- never lost / on time (2): a dead run's marker holds its bucket ~33 s; an outage's mark
  lost to an older restore ending; a timer due between two migrator runs waits for the
  cycle; a burst over the lease's scan delays another tenant.

Fixtures and helpers: the trigger's rig (test_trigger.py), the fan-out's and migrator's
(test_fanout.py, test_migrator.py), test_fire_path's World, the api harness, a FakeClock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import boto3
import pytest
import redis

from tests.integration.api_harness import SETTINGS, Api, make_api
from tests.integration.test_fanout import (  # noqa: F401 - conn, index, invokes are fixtures
    BUCKETS,
    Invokes,
    act_at,
    conn,
    index,
    invokes,
    make_deps,
)
from tests.integration.test_fire_path import ON_TIME_MS, World
from tests.integration.test_migrator import (
    ACME_SHARD0,
    PER_SHARD,
    SMALL_BUDGET,
    SMALL_PAGE,
    index_of,
    indexed,
    lagging,
    migrate,
    seed,
    whole,
)
from tests.integration.test_trigger import (  # noqa: F401 - rig is a fixture
    LAPSE_MS,
    Kill,
    Rig,
    SinkSqs,
    after,
    create_many,
    kill_at,
    rig,
    until_armed,
)
from tests.support.clock import T0, FakeClock
from tests.support.sick_redis import SickRedis
from timers.core.schedule import AtSchedule
from timers.core.times import format_ms
from timers.engine import keys
from timers.engine.fanout import POLL_MS, Fanout
from timers.engine.index import BucketIndex
from timers.engine.trigger import LEASE_LIMIT
from timers.runtime import DAY_MS

pytestmark = pytest.mark.integration

BIG = 600  # characters: a payload over INLINE_PAYLOAD_BYTES lives in its own item


# ---------------------------------------------------------------- idempotent creates in flight


def test_a_retried_create_in_flight_never_undoes_a_patch_of_the_payload(
    rig: Rig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant 4 (changes win). The first attempt of a keyed create stalls before it writes
    (a slow DynamoDB call; the client times out and retries). The retry stores the timer and
    answers; the user PATCHes its payload. The first attempt then goes on: ``create_one``
    saves the payload item unconditionally (the timer's own put is conditional and fails,
    which ``_store_keyed`` takes for "stored by another attempt"), putting the old body back
    under the changed timer."""
    api = rig.api
    headers = {"Idempotency-Key": "order-9"}
    body = {"schedule": after(600), "payload": {"v": "old" + "x" * BIG}}  # beyond the look-ahead
    store = api.runtime.service.timers
    create_guarded = store.create_guarded
    answers: list[Any] = []

    def stalled_first(timer: Any, guard: Any, stored: Any) -> Any:
        if not answers:  # the retry and the user's PATCH happen while the first is here
            answers.append(None)
            answers[0] = api.call("POST", "/v1/timers", body=body, headers=headers)
            timer_id = answers[0].body["id"]
            patched = api.call(
                "PATCH", f"/v1/timers/{timer_id}", body={"payload": {"v": "new" + "y" * BIG}}
            )
            assert patched.status == 200, patched.body
        return create_guarded(timer, guard, stored)

    monkeypatch.setattr(store, "create_guarded", stalled_first)
    first = api.call("POST", "/v1/timers", body=body, headers=headers)
    assert first.status == 201 and first.body["id"] == answers[0].body["id"]
    monkeypatch.setattr(store, "create_guarded", create_guarded)

    timer_id = first.body["id"]
    rig.clock.now = T0 + 600_000 - 60_000
    rig.migrate()  # the card comes into Redis from DynamoDB
    rig.clock.now = T0 + 600_000
    rig.run_until_idle()
    (message,) = rig.drain(api.queues["acme"])
    assert message["payload"]["v"].startswith("new")  # the PATCH won
    shown = api.call("GET", f"/v1/timers/{timer_id}").body
    assert shown["payload"]["v"].startswith("new")


def test_a_retried_batch_create_in_flight_never_brings_back_a_deleted_timer(
    rig: Rig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant 4 (changes win; DELETE: the timer never fires again, GET is 404). The first
    attempt of a keyed batch create stalls before its timers are written. The retry stores
    them one by one and answers; the first every-second timer's first fire is claimed, and the
    user deletes the timer while that fire is on its way (no fence: the claim is owed). The
    first attempt then goes on: ``TimerStore.create`` writes a batch with unconditional puts,
    re-creating the deleted timer at revision 1, and its fast path puts its card back: it
    fires every second from then on."""
    api = rig.api
    headers = {"Idempotency-Key": "batch-9"}
    body = {"timers": [{"schedule": {"type": "every", "seconds": 1}}, {"schedule": after(600)}]}
    store = api.runtime.service.timers
    create_guarded = store.create_guarded
    answers: list[Any] = []

    def stalled_first(timers: Any, guard: Any, stored: Any) -> Any:
        if len(timers) > 1 and not answers:  # the first attempt's batch write waits here
            answers.append(None)  # (the retry's own write passes)
            answers[0] = api.call("POST", "/v1/timers:batch", body=body, headers=headers)
            assert answers[0].status == 201, answers[0].body
            timer_id = answers[0].body["items"][0]["id"]
            deleted: list[int] = []

            def delete_while_claimed(step: str) -> None:
                if step == "claimed" and not deleted:
                    deleted.append(api.call("DELETE", f"/v1/timers/{timer_id}").status)

            until_armed(rig, T0 + 1_000)
            rig.run(hooks=delete_while_claimed)
            assert deleted == [204]
            assert api.call("GET", f"/v1/timers/{timer_id}").status == 404
        return create_guarded(timers, guard, stored)

    monkeypatch.setattr(store, "create_guarded", stalled_first)
    first = api.call("POST", "/v1/timers:batch", body=body, headers=headers)
    assert first.status == 201, first.body
    monkeypatch.setattr(store, "create_guarded", create_guarded)
    timer_id = answers[0].body["items"][0]["id"]

    for _ in range(3):
        rig.clock.advance(1_000)
        rig.run_until_idle()
    fired = Counter(s.fire_id for s in rig.sqs.sent if s.fire_id.startswith(timer_id))
    assert fired == Counter({f"{timer_id}:{T0 + 1_000}": 1})  # only the fire claimed before
    assert api.call("GET", f"/v1/timers/{timer_id}").status == 404


# ---------------------------------------------------------------- retention


def expire_claim_items(at: Rig) -> None:
    """DynamoDB's TTL: fire-log items past their ``expires_at`` are deleted."""
    dynamodb = boto3.client("dynamodb")
    for item in dynamodb.scan(TableName=SETTINGS.claims_table)["Items"]:
        if int(item.get("expires_at", {"N": "0"})["N"]) <= at.clock() // 1000:
            dynamodb.delete_item(TableName=SETTINGS.claims_table, Key={"k": item["k"]})


def test_a_one_shot_fired_late_never_fires_again_after_its_entry_expires(
    rig: Rig,  # noqa: F811
) -> None:
    """Invariant 3 (one callback per fire). A one-shot due at D is paused before D and resumed
    five days later: it fires at once, late (its fire id is still ``<id>:D``). Its timer item
    expires ``retention`` after the resume (``with_expiry``: max(due, now)), but the fire-log
    item holding its entry expires ``retention + 1 day`` after D (``FireLog.expires_at``: the
    position's second). In between, the timer is read without its entry: the walk finds D
    unfinished - GET shows it active with next_fire_at D - and a PATCH of its name fences D,
    puts its card back and the trigger sends D again."""
    timer = rig.api.create(schedule=after(10))
    timer_id, due = timer["id"], T0 + 10_000
    rig.clock.now = T0 + 1_000
    assert rig.api.call("POST", f"/v1/timers/{timer_id}/pause").status == 200
    rig.clock.now = T0 + 5 * DAY_MS
    assert rig.api.call("POST", f"/v1/timers/{timer_id}/resume").status == 200
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{timer_id}:{due}": 1})  # late, once
    assert rig.timer(timer_id)["status"] == "completed"

    rig.clock.now = due + (SETTINGS.fire_retention_days + 2) * DAY_MS  # the timer is still kept
    expire_claim_items(rig)
    shown = rig.api.call("GET", f"/v1/timers/{timer_id}")
    assert shown.status == 200  # retained until the resume + retention
    reply = rig.api.call("PATCH", f"/v1/timers/{timer_id}", body={"name": "renamed"})
    assert reply.status == 200, reply.body
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{timer_id}:{due}": 1})  # sent once, not again
    assert (shown.body["status"], shown.body["fire_count"]) == ("completed", 1)


# ---------------------------------------------------------------- changes win


def test_a_timer_deleted_while_its_fire_is_claimed_never_fires_again_whatever_redis_holds(
    rig: Rig,  # noqa: F811
) -> None:
    """Invariant 4 (changes win; DELETE: the timer never fires again). A delete that meets a
    pending claim at the cursor neither fences nor adopts it (``Changes._attempt``: only a
    change that keeps the timer adopts): the owed fire goes, which is allowed. But the card
    of the deleted revision stays in Redis when the delete's Redis update fails (the api
    logs it and goes on, as a failover that lost the drop would leave it). The run records
    the owed fire at the card's own revision, so ``_owner_of`` trusts the card's timer
    without reading it, chains the card to the next position - which has no fence - and
    every later run claims and sends a fire of a timer that no longer exists."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 1})
    timer_id = timer["id"]
    changes = rig.api.runtime.service.changes
    deleted: list[int] = []

    def delete_while_claimed(step: str) -> None:
        if step == "claimed" and not deleted:
            changes.index = None  # the delete's Redis update fails (logged; DynamoDB is truth)
            deleted.append(rig.api.call("DELETE", f"/v1/timers/{timer_id}").status)
            changes.index = rig.index

    until_armed(rig, T0 + 1_000)
    rig.run(hooks=delete_while_claimed)
    assert deleted == [204]
    assert rig.api.call("GET", f"/v1/timers/{timer_id}").status == 404
    for _ in range(3):
        rig.clock.advance(1_000)
        rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{timer_id}:{T0 + 1_000}": 1})  # the owed fire only


# ---------------------------------------------------------------- dispatch


class KillingWorld(World):
    """The deployed shape poll by poll (test_fire_path's World), where the trigger runs of one
    bucket started in [kill_from, kill_until) die after claiming (OOM, a lost host)."""

    def __init__(self, api: Api, kill_from: int, kill_until: int) -> None:
        super().__init__(api)
        self.kill_from, self.kill_until = kill_from, kill_until
        self.killed = 0
        self._alive = self.trigger
        self._dying = replace(self.trigger, hooks=kill_at("claimed"))

    def run_until(self, end_ms: int) -> None:
        while self.clock() < end_ms:
            dying = self.kill_from <= self.clock() < self.kill_until
            self.trigger = self._dying if dying else self._alive
            try:
                super().run_until(min(end_ms, self.clock() + POLL_MS))
            except Kill:
                self.killed += 1
                self.invoked.clear()
                self.clock.advance(POLL_MS)


def test_a_dead_trigger_run_delays_only_what_it_had_leased(
    aws: None,
    clock: FakeClock,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant 2 (never lost, "a function dies at any line") and the precision target (a
    fire within a second of its due time; one tenant's trouble never delays another's). A
    run that dies after claiming acme's fire leaves that fire late until its claim lapses
    (documented: ~33 s). But it also leaves its ``run:<b>:0`` marker, which
    ``run_trigger`` extended to its whole remaining time plus LEASE_GRACE_MS: with a
    backlog under PER_TRIGGER the fan-out wants slot 0 only, finds it taken (``busy``), and
    globex's timer due three seconds later in the same bucket - leased by no one - waits
    for the marker to expire. (Redis expires keys on its own clock, not the fake one: the
    test looks at 10:00:15, long before the marker's ~33 s would run out either way.)"""
    api = make_api(monkeypatch, clock, redis_url, bucket_count=1)
    world = KillingWorld(api, kill_from=T0 + 4_500, kill_until=T0 + 5_500)
    theirs = api.create(schedule=after(5))
    ours = api.create("globex", schedule=after(8))
    world.run_until(T0 + 15_000)
    assert world.killed == 1
    assert world.fires_of(theirs["id"]) == Counter()  # late: its claim lapses ~33 s later
    assert api.runtime.redis.pttl(keys.run(0, 0)) > 20_000  # the dead run's slot stays held
    assert world.fanout.report.lapsed > 0  # ... and is passed over: its promised beat lapsed
    lags = world.lags(ours["id"])
    assert list(lags) == [T0 + 8_000], lags
    assert 0 <= lags[T0 + 8_000] <= ON_TIME_MS


# ---------------------------------------------------------------- fire ids


def test_a_new_schedule_never_reuses_the_fire_id_of_a_catch_up_fire(
    rig: Rig,  # noqa: F811
) -> None:
    """Invariant 3 (one callback per fire id; consumers deduplicate on it). After an outage a
    fire_once timer fires one catch-up: the latest missed occurrence L, claimed in the entry
    of the first missed position P (``fired`` = L, the fire id ``<id>:L``). A PATCH to an
    ``at`` schedule at L (allowed: up to 5 minutes in the past) is checked by
    ``_first_unclaimed`` against the entry at L, which does not exist - so the timer fires
    ``<id>:L`` again: a consumer drops it as a duplicate, or the user sees two fires with one
    id."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 60})  # fire_once
    timer_id = timer["id"]
    rig.clock.now = T0 + 10 * 60_000 + 50_000  # down for ten minutes
    rig.run_until_idle()
    latest = T0 + 10 * 60_000
    assert rig.per_fire() == Counter({f"{timer_id}:{latest}": 1})  # the catch-up, at 10:10
    reply = rig.api.call(
        "PATCH",
        f"/v1/timers/{timer_id}",
        body={"schedule": {"type": "at", "at": format_ms(latest)}},
    )
    if reply.status == 200:  # accepted: then it must not fire under a used fire id
        rig.run_until_idle()
    else:
        assert reply.status == 400, reply.body
    assert max(rig.per_fire().values()) == 1
    fire_ids = [f["fire_id"] for f in rig.fires(timer_id)]
    assert len(fire_ids) == len(set(fire_ids))


# ---------------------------------------------------------------- a run meeting its own claim


def test_a_run_that_meets_its_own_claim_again_sends_the_fire_once(
    rig: Rig,  # noqa: F811
) -> None:
    """Invariant 3 (one callback per fire, outside the documented window: nobody died). A run
    claims 10:00:01 ahead of time (armed) and waits for it. Redis loses the bucket (a flush, a
    shard back empty) and the migrator restores it at once, putting the card back at its
    pending position, leasable. Before the send, the same run leases again for the next timer
    due (10:00:01.1) and gets the restored card too: ``decide_claim`` answers "ours" (the
    entry's owner is this run - the case meant for a claim write retried after a timeout), the
    job joins ``pending`` beside the first, and both copies go out in one batch."""
    first = rig.api.create(schedule=after(1))
    rig.api.create(schedule=after(1.1))
    restored: list[str] = []

    def lose_and_restore(step: str) -> None:
        if step == "claimed" and not restored:
            restored.append(step)
            rig.api.runtime.redis.flushall()
            rig.migrate()  # the fan-out saw the bucket lost: restored at once

    until_armed(rig, T0 + 1_000)
    (report,) = rig.run(hooks=lose_and_restore)
    assert (report.taken_over, report.ambiguous) == (0, 0)  # no takeover, no lost answer
    rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()
    assert rig.per_fire()[f"{first['id']}:{T0 + 1_000}"] == 1


# ---------------------------------------------------------------- restores


class RacingIndex(BucketIndex):
    """A bucket index where, once, something else happens between the fan-out's peek and its
    swap of a sentinel (another actor's Redis call landing between two of the fan-out's)."""

    def __init__(self, client: Any, bucket_count: int) -> None:
        super().__init__(client, bucket_count)
        self.meanwhile: list[Callable[[], Any]] = []

    def swap_field(self, bucket: int, name: str, expected: str | None, new: str) -> bool:
        while self.meanwhile:
            self.meanwhile.pop(0)()
        return super().swap_field(bucket, name, expected, new)


def test_a_bucket_back_from_an_outage_is_restored_even_if_an_older_restore_ends_meanwhile(
    clock: FakeClock,
    invokes: Invokes,  # noqa: F811
    conn: redis.Redis,  # noqa: F811
    index: BucketIndex,  # noqa: F811
) -> None:
    """Invariant 2 (never lost: a failover that may have lost writes is restored). Bucket 3 is
    restoring from an earlier loss (sentinel ``r<E>.<E>``); its shard then fails over (the
    fan-out sees it down) and may have lost writes - among them cards that restore had
    already put back. When it answers again, ``Fanout._lost`` swaps the sentinel from what
    this peek saw to a new epoch. If the earlier restore ends just then (its pass reads the
    sentinel, sees its epoch, swaps it to "ok"), the fan-out's swap fails, it drops the
    bucket from ``_down`` and returns False: no restore is asked, the sentinel says "ok", and
    what the failover lost is only found by the minute's cycle, however long that takes."""
    earlier = f"r{T0 - 10_000}.{T0 - 10_000}"
    index.set_field(3, keys.SENTINEL, earlier)  # restoring since 10 s ago
    sick = SickRedis(conn)
    racing = RacingIndex(sick, BUCKETS)
    fanout = Fanout(make_deps(racing, clock, invokes))
    act_at(fanout, clock, T0)
    sick.sick = {3: "down"}  # the shard fails over
    act_at(fanout, clock, T0 + POLL_MS)
    sick.sick = {}  # back; the earlier restore's pass ends between this peek and the swap
    racing.meanwhile.append(lambda: index.swap_field(3, keys.SENTINEL, earlier, "ok"))
    act_at(fanout, clock, *range(T0 + 2 * POLL_MS, T0 + 20 * POLL_MS, POLL_MS))
    assert invokes.restored() == [3]
    sentinel = index.field(3, keys.SENTINEL)  # a new epoch, marked by the next poll at most
    assert sentinel is not None and sentinel.startswith("r")
    assert T0 + 2 * POLL_MS <= int(sentinel[1:].partition(".")[0]) <= T0 + 3 * POLL_MS


# ---------------------------------------------------------------- the migrator's slices


def test_a_one_shot_whose_fast_path_failed_is_found_by_the_next_run(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 2 ("what Redis loses is rebuilt"; the fast path's failure costs "only time")
    and the precision target. A one-shot due in 5 s is created while its Redis write fails
    (the api logs it: "the migrator will catch up"). The migrator's next run comes after the
    due time: its upcoming slice starts at its own ``now``, so the listing (wake = the due
    time, now past) is left to the cycle over everything overdue - which, on a bucket with a
    backlog of overdue listings (every recurring timer chained in Redis keeps one at its
    checkpoint), reaches the newest ones last: here six runs, six minutes late. Scaled
    down: PER_SHARD listings a run, as test_migrator's budget tests."""
    monkeypatch.setattr("timers.engine.migrate.PAGE", SMALL_PAGE)
    api = make_api(monkeypatch, clock, redis_url)
    api.clock.now = T0 + DAY_MS
    backlog = lagging(api, "acme", ACME_SHARD0, 5 * PER_SHARD)
    whole(api)
    changes = api.runtime.wiring.changes
    changes.index = None  # the create's Redis write fails (logged; DynamoDB stays the truth)
    one_shot = seed(api, "acme", ACME_SHARD0, AtSchedule(T0 + DAY_MS + 5_000),
                    T0 + DAY_MS + 5_000, T0 + DAY_MS)  # fmt: skip
    changes.index = index_of(api)
    assert one_shot.id not in indexed(api) and len(backlog) == 5 * PER_SHARD

    runs = 0
    api.clock.now = T0 + DAY_MS + 30_000  # the minute's run, 25 s after it fell due
    while one_shot.id not in indexed(api) and runs < 10:
        migrate(api, budget=SMALL_BUDGET)
        runs += 1
        api.clock.advance(60_000)
    assert runs == 1  # found by the first run after its due time


# ---------------------------------------------------------------- fairness


def test_a_burst_larger_than_the_lease_scan_never_delays_another_tenant(
    rig: Rig,  # noqa: F811
) -> None:
    """Design: "one tenant's burst must not delay another tenant's timers"; fairness: "a lease
    takes members round-robin across tenants". lease.lua takes its candidates with
    ``ZRANGEBYSCORE due -inf until LIMIT 0 scan`` (scan = 4 x limit = 400) and goes
    round-robin among those only. Members of one instant are ordered by name, so acme's 600
    fires due at 10:00:01 fill the whole scan and globex's one fire of the same instant is
    leased only in the fourth lease, after 300 of acme's (the existing test has 300: under
    the scan). A bucket shared with a burst of N waited for N - 300 of it. Fixed: what lies
    behind the look is queued fairly (lua/lease.lua), so globex's is in the first lease."""
    create_many(rig, "acme", 600, [T0 + 1_000])
    (lone,) = create_many(rig, "globex", 1, [T0 + 1_000])
    rig.sqs.real = SinkSqs()
    rig.clock.now = T0 + 1_000
    rig.run()
    order = [s.fire_id for s in rig.sqs.sent]
    assert order.index(f"{lone['id']}:{T0 + 1_000}") < LEASE_LIMIT  # in the first lease
