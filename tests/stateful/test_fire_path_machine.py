"""Never lost, proven by trying: the real fire path under a stateful fault model (issue 16).

A Hypothesis ``RuleBasedStateMachine`` drives the real code - the api handler, the migrator,
the fan-out and the trigger, on a real redis-server and moto, one injected clock - through
random interleavings of: single and batch creates (some dying between their writes, some
retried with their Idempotency-Key after the first attempt died), PATCH of every field, pause,
resume, reset, run now (alone and racing a change), delete; group operations (pause, resume,
delete every timer of a group: in steps, racing fires, with creates into the group between
its calls, dying between its writes and called again); migrator, fan-out and trigger runs
that die at any step (after the lease, the claim, the send, the record...) or run out of time;
changes made in the middle of a run; Redis FLUSHALL at any point, a bucket's data lost, a
failover to a replica that lagged (every write since its snapshot lost), and Redis commands
failing; DynamoDB timeouts before and after a write is applied, throttling, kills inside any
call; host clocks off and stepping; retention expiry.

After every step the reference model (``tests/stateful/model.py``) checks each callback sent:
never early, an occurrence of a revision current when it was claimed, with a current payload,
once (outside the documented died-after-send window). At each settle point - faults off, the
service left to run a little over two minutes - it checks that nothing was lost and that GET
and the fire history show exactly what was sent.

``make test`` runs a fixed seed within a few minutes. A soak: ``TIMERS_MACHINE_RANDOM=1
TIMERS_MACHINE_EXAMPLES=500 pytest tests/stateful -p no:randomly --hypothesis-seed=<n>`` (without
``TIMERS_MACHINE_RANDOM`` the seed is ignored: the fixed one runs; on the real parts the count is
``TIMERS_MACHINE_REAL_PARTS_EXAMPLES``). A failure prints its shrunk steps and, with a lost fire,
what the service held for that timer: on the real parts a failure may not replay.
``ops/check_reverts.py`` re-introduces each of issue 16's defects in a copy of the code and
shows that this test finds it.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.integration.api_harness import SETTINGS, Reply
from tests.stateful.model import ModelTimer, Revision, payload_key
from tests.stateful.world import Fault, Kill, World, injected
from tests.support.real_parts import RedisTarget
from timers.core.schedule import Plan, first_fire, is_recurring, next_fire, schedule_from_dict
from timers.core.times import format_ms, parse_ms
from timers.engine.trigger import HOOKS
from timers.runtime import DAY_MS

pytestmark = [pytest.mark.integration, pytest.mark.real_parts]

EXAMPLES = int(os.environ.get("TIMERS_MACHINE_EXAMPLES", "40"))
REAL_PARTS_EXAMPLES = int(os.environ.get("TIMERS_MACHINE_REAL_PARTS_EXAMPLES", "12"))
"""Fewer on the real parts: a failover or a lost shard takes seconds of real time."""
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
NO_SHRINK = PHASES[:-1]  # ops/check_reverts.py: a failure is all it needs to see
SETTLE_MS = SETTINGS.lookahead_seconds * 1000 + 15_000
"""Long enough for a lost member to come back (the migrator runs at once and each minute), for
a dead run's claims to lapse and be taken over, and for the look-ahead to be crossed."""
SLACK_MS = 45_000
"""Fires due this close to the end of a settle may still be on their way: a takeover of a dead
run's claim comes ~33 s after that run started."""

SCHEDULES: list[Callable[[int], dict[str, Any]]] = [
    lambda now: {"type": "after", "seconds": 0.3},
    lambda now: {"type": "after", "seconds": 1},
    lambda now: {"type": "after", "seconds": 25},
    lambda now: {"type": "after", "seconds": 60},
    lambda now: {"type": "after", "seconds": 90},
    lambda now: {"type": "after", "seconds": 150},
    lambda now: {"type": "at", "at": format_ms(now - 60_000)},
    lambda now: {"type": "at", "at": format_ms(now + 2_000)},
    lambda now: {"type": "at", "at": format_ms(now + 130_000)},
    lambda now: {"type": "every", "seconds": 1},
    lambda now: {"type": "every", "seconds": 3},
    lambda now: {"type": "every", "seconds": 7},
    lambda now: {"type": "every", "seconds": 300},  # beyond the look-ahead: held in Redis
    lambda now: {"type": "cron", "expression": "* * * * *"},  # a minute
]
schedules = st.sampled_from(range(len(SCHEDULES)))
misfires = st.sampled_from(["fire_all", "fire_once", "skip"])
max_fires = st.sampled_from([None, None, 2, 5])
tenants = st.sampled_from(["acme", "acme", "globex"])  # acme: one claim partition (hot items)
windows = st.sampled_from([0, 0, 0, 2, 30])  # a flexible window (s): fires batched within it
GROUPS = ("g0", "g1")
groups = st.sampled_from([None, "g0", "g0", "g1"])
group_actions = st.sampled_from(["pause", "resume", "delete"])
steps = st.sampled_from(HOOKS)
race_steps = st.sampled_from(["leased", "claimed", "claimed", "claimed", "sent", "recorded"])
"""Where a change meets a run: mostly between the claim and the send (the race that matters)."""
writes = st.sampled_from(["UpdateItem", "TransactWriteItems", "BatchWriteItem", "PutItem", "*"])
fault_kinds = st.sampled_from(["kill", "timeout_before", "timeout_after", "throttle"])
remaining = st.sampled_from([30_000, 30_000, 24_000, 21_000])
serial = itertools.count()


def _payload(big: bool = False) -> dict[str, Any]:
    """Unique per request, so each callback names the revision it carries; ``big`` ones live
    in their own payload item."""
    n = next(serial)
    return {"n": n, "pad": "x" * 700} if big else {"n": n}


picks = st.integers(0, 999)
"""A timer, as an index into the ones made so far - not a Bundle: what a draw may be must not
depend on the system's state, which threads and a real Redis keep from replaying exactly (a
Bundle's size would differ between a test case and its replay)."""


class FirePathMachine(RuleBasedStateMachine):
    redis_at = RedisTarget("", cluster=False)
    dynamodb: str | None = None  # DynamoDB Local's endpoint (make test-real), else moto
    cluster: Any = None  # the Redis Cluster whose faults the cluster rules inflict

    def __init__(self) -> None:
        super().__init__()
        self.world = World(self.redis_at, self.dynamodb, self.cluster)
        self.model = self.world.model
        self.anchors: dict[str, int] = {}  # timer id -> when its schedule was set
        self.owner: dict[str, str] = {}  # timer id -> tenant
        self.group_of: dict[str, str | None] = {}  # timer id -> its group, as last answered

    def teardown(self) -> None:
        """Every example ends settled and checked (unless it already failed)."""
        try:
            if sys.exc_info()[1] is None:
                self.settle()
        finally:
            self.world.close()

    # ------------------------------------------------------------ the model's bookkeeping

    def _call(self, method: str, path: str, tenant: str = "acme", **kw: Any) -> Reply | None:
        """A request; None if the api died in it (an injected kill or fault)."""
        try:
            reply = self.world.api.call(method, path, tenant=tenant, **kw)
        except BaseException as exc:
            if not injected(exc):
                raise
            return None
        assert reply.status < 500 or self.world.faults.fired, f"{method} {path}: {reply.body}"
        return None if reply.status >= 500 else reply

    def _revision(self, view: dict[str, Any], anchor: int, at: int) -> Revision:
        bound = lambda name: parse_ms(view[name]) if view[name] else None  # noqa: E731
        plan = Plan(
            schedule_from_dict(view["schedule"]),
            anchor,
            bound("start_at"),
            bound("end_at"),
            view["max_fires"],
        )
        window = round(view["window_seconds"] * 1000)
        return Revision(plan, view["status"], view["payload"], view["name"], view["misfire"], at,
                        window_ms=window)  # fmt: skip

    def _pick(self, pick: int) -> str | None:
        """The ``pick``-th timer the test made, round the list; None while there is none."""
        made = list(self.model.timers)
        return made[pick % len(made)] if made else None

    def _learn(self, view: dict[str, Any], tenant: str, anchor: int) -> str:
        self.anchors[view["id"]] = anchor
        self.owner[view["id"]] = tenant
        self.group_of[view["id"]] = view["group"]
        self.model.timers[view["id"]] = ModelTimer(
            view["id"], [self._revision(view, anchor, self.world.clock())]
        )
        return str(view["id"])

    def _changed(self, timer_id: str, view: dict[str, Any] | None, schedule_changed: bool) -> None:
        now = self.world.clock()
        timer = self.model.timers[timer_id]
        if view is None:
            timer.current.until = now
            timer.deleted_at = now
            return
        if schedule_changed:
            self.anchors[timer_id] = now
        self.group_of[timer_id] = view["group"]
        revision = self._revision(view, self.anchors[timer_id], now)
        if revision.status == "completed" and timer.current.status != "completed":
            assert self._may_complete(timer_id, revision), f"completed by a change: {view}"
        timer.change(revision)

    def _may_complete(self, timer_id: str, revision: Revision) -> bool:
        """A change completes a timer only when nothing is left of its new plan: max_fires
        reached by the fires claimed so far, or no occurrence after the last of them."""
        claimed = sorted(
            int(fire_id.rsplit(":", 1)[1])
            for fire_id in self.model.claimed
            if fire_id.rsplit(":", 1)[0] == timer_id
        )
        plan = revision.plan
        if plan.max_fires is not None and plan.max_fires <= len(claimed):
            return True
        if not is_recurring(plan.schedule):
            return first_fire(plan) in claimed or first_fire(plan) is None
        after = max([self.world.clock() - 1, *claimed])
        return next_fire(plan, after) is None

    def _resolve(self, timer_id: str, intended: Callable[[dict[str, Any] | None], bool],
                 schedule_changed: bool) -> None:  # fmt: skip
        """A change whose request died: read what DynamoDB has, and learn whether it applied."""
        with self.world.observing():
            got = self.world.api.call("GET", f"/v1/timers/{timer_id}", tenant=self.owner[timer_id])
        view = got.body if got.status == 200 else None
        if intended(view):
            self._changed(timer_id, view, schedule_changed)

    # ------------------------------------------------------------ creating

    @initialize(which=schedules, tenant=tenants, misfire=misfires, window=windows, group=groups)
    def first_timer(
        self, which: int, tenant: str, misfire: str, window: float, group: str | None
    ) -> None:
        self.create(which, tenant, misfire, None, False, window, group)

    @rule(which=schedules, tenant=tenants, misfire=misfires, limit=max_fires,
          big=st.booleans(), window=windows, group=groups)  # fmt: skip
    def create(
        self, which: int, tenant: str, misfire: str, limit: int | None, big: bool, window: float,
        group: str | None = None,
    ) -> None:  # fmt: skip
        now = self.world.clock()
        body = {"schedule": SCHEDULES[which](now), "misfire": misfire, "payload": _payload(big),
                "name": f"t{next(serial)}", "max_fires": limit,
                "window_seconds": window, **({"group": group} if group else {})}  # fmt: skip
        reply = self._call("POST", "/v1/timers", tenant, body=body)
        if reply is None or reply.status != 201:
            assert reply is None or reply.status == 400, reply.body
            self.model.maybe_payloads.add(payload_key(body["payload"]))
            return
        self._learn(reply.body, tenant, now)

    @rule(which=st.lists(schedules, min_size=2, max_size=6), big=st.booleans(),
          tenant=tenants, die_at=st.none() | st.integers(0, 2), group=groups)  # fmt: skip
    def create_batch(
        self, which: list[int], big: bool, tenant: str, die_at: int | None, group: str | None
    ) -> None:
        """A batch create - one that dies at its first, second or third DynamoDB write too
        (issue 16, defect 5: its timers must never fire without their payloads) - all of it
        into one group, or none."""
        now = self.world.clock()
        specs = [{"schedule": SCHEDULES[w](now), "payload": _payload(big), "name": f"b{i}",
                  **({"group": group} if group else {})}
                 for i, w in enumerate(which)]  # fmt: skip
        if die_at is not None:  # the payloads', the timers' or the wakeups' write
            self.world.faults.armed.append(Fault("BatchWriteItem", "kill", skip=die_at))
        reply = self._call("POST", "/v1/timers:batch", tenant, body={"timers": specs})
        self.world.faults.armed.clear()
        self._learn_batch(reply, specs, tenant, now)

    def _learn_batch(
        self, reply: Reply | None, specs: list[dict[str, Any]], tenant: str, now: int
    ) -> None:
        if reply is None or reply.status != 201:
            self.model.maybe_payloads |= {payload_key(s["payload"]) for s in specs}
            return
        for view in reply.body["items"]:
            self._learn(view, tenant, now)

    @rule(which=st.lists(schedules, min_size=1, max_size=3), tenant=tenants,
          die_at=st.integers(0, 5))  # fmt: skip
    def create_retried_with_its_key(self, which: list[int], tenant: str, die_at: int) -> None:
        """A create with an Idempotency-Key dies at one of its DynamoDB calls; its retry (the
        same key and body) answers the timers the first attempt chose, which exist and fire -
        never two sets, never one deleted by the retry (issue 28, defects 1 and 2)."""
        now = self.world.clock()
        specs = [{"schedule": SCHEDULES[w](now), "payload": _payload(), "name": f"k{i}"}
                 for i, w in enumerate(which)]  # fmt: skip
        path, body = ("/v1/timers", specs[0]) if len(specs) == 1 else \
            ("/v1/timers:batch", {"timers": specs})  # fmt: skip
        headers = {"Idempotency-Key": f"key-{next(serial)}"}
        self.world.faults.armed.append(Fault("*", "kill", skip=die_at))
        first = self._call("POST", path, tenant, body=body, headers=headers)
        self.world.faults.armed.clear()
        again = self._call("POST", path, tenant, body=body, headers=headers)
        if again is None or again.status != 201:  # a fault armed before this rule hit it
            assert again is None or again.status == 400, again.body
            self.model.maybe_payloads |= {payload_key(s["payload"]) for s in specs}
            return
        assert first is None or first.body == again.body, (first.body, again.body)
        views = again.body["items"] if len(specs) > 1 else [again.body]
        for view in views:
            self._learn(view, tenant, now)

    @rule(which=schedules, tenant=tenants)
    def create_racing_the_migrator(self, which: int, tenant: str) -> None:
        """A migrator run lands between a create's wake listing and its timer (issue 28, defect
        5: it took the listing of a timer it could not read yet for dead and deleted it - and
        a flush later lost the one-shot for good)."""
        now = self.world.clock()
        body = {"schedule": SCHEDULES[which](now), "payload": _payload(), "name": "r"}
        with self.world.migrator_inside_the_next_create():
            reply = self._call("POST", "/v1/timers", tenant, body=body)
        if reply is None or reply.status != 201:
            assert reply is None or reply.status == 400, reply.body
            self.model.maybe_payloads.add(payload_key(body["payload"]))
            return
        self._learn(reply.body, tenant, now)

    @rule(count=st.sampled_from([16, 40]), tenant=tenants)
    def hot_second(self, count: int, tenant: str) -> None:
        """Many one-shots of one tenant due in the same millisecond: more entries than a claim
        item takes (issue 16, defect 2)."""
        now = self.world.clock()
        due = format_ms(now + 1_500)
        specs = [{"schedule": {"type": "at", "at": due}, "payload": _payload(), "name": "h"}
                 for _ in range(count)]  # fmt: skip
        reply = self._call("POST", "/v1/timers:batch", tenant, body={"timers": specs})
        self._learn_batch(reply, specs, tenant, now)

    @rule(crowd=st.sampled_from([45, 90]), neighbours=st.sampled_from([1, 4]))
    def crowd_and_its_neighbours(self, crowd: int, neighbours: int) -> None:
        """acme's crowd of one-shots due in one millisecond - more than a lease looks at - and
        globex's few due in it too (globex sorts after acme; some share acme's bucket): every
        lease that takes something takes globex's too (the fairness invariant)."""
        now = self.world.clock()
        due = format_ms(now + 1_500)
        for tenant, count in (("acme", crowd), ("globex", neighbours)):
            specs = [{"schedule": {"type": "at", "at": due}, "payload": _payload(), "name": "c"}
                     for _ in range(count)]  # fmt: skip
            reply = self._call("POST", "/v1/timers:batch", tenant, body={"timers": specs})
            self._learn_batch(reply, specs, tenant, now)

    # ------------------------------------------------------------ changing

    def _patch(self, timer_id: str, body: dict[str, Any]) -> None:
        path = f"/v1/timers/{timer_id}"
        sent_at = self.world.clock()
        reply = self._call("PATCH", path, self.owner[timer_id], body=body)
        schedule_changed = "schedule" in body
        if reply is None:
            self._resolve(timer_id, lambda v: v is not None and _applied(v, body, sent_at),
                          schedule_changed)  # fmt: skip
        elif reply.status == 200:
            self._changed(timer_id, reply.body, schedule_changed)
        else:
            assert reply.status in (400, 404), reply.body
            assert reply.status == 400 or self.model.timers[timer_id].deleted_at is not None

    def _patches(self, timer_id: str, what: str, which: int) -> dict[str, Any]:
        now = self.world.clock()
        return {
            "name": {"name": f"p{next(serial)}"},
            "payload": {"payload": _payload()},
            "schedule": {"schedule": SCHEDULES[which](now)},
            "max_fires": {"max_fires": [1, 3, 10][which % 3]},
            "end_at": {"end_at": format_ms(now + [5_000, 90_000, 600_000][which % 3])},
            "start_at": {"start_at": format_ms(now + [-30_000, 4_000, 70_000][which % 3])},
            "misfire": {"misfire": ["fire_all", "fire_once", "skip"][which % 3]},
            "window": {"window_seconds": [0, 2, 30][which % 3]},
            "group": {"group": [None, *GROUPS][which % 3]},  # moves it, or takes it out
        }[what]

    @rule(pick=picks, what=st.sampled_from(["name", "payload", "schedule", "max_fires",
          "end_at", "start_at", "misfire", "window", "group"]), which=schedules)  # fmt: skip
    def patch(self, pick: int, what: str, which: int) -> None:
        if (timer := self._pick(pick)) is not None:
            self._patch(timer, self._patches(timer, what, which))

    def _act(self, timer_id: str, action: str) -> None:
        tenant = self.owner[timer_id]
        path = f"/v1/timers/{timer_id}"
        if action == "delete":
            reply = self._call("DELETE", path, tenant)
            if reply is None:
                self._resolve(timer_id, lambda v: v is None, False)
            elif reply.status == 204:
                self._changed(timer_id, None, False)
            return
        if action == "reset":
            self._reset(timer_id)
            return
        if action == "run":
            self._run_now(timer_id)
            return
        reply = self._call("POST", f"{path}/{action}", tenant)
        want = "paused" if action == "pause" else "active"
        if reply is None:
            self._resolve(timer_id, lambda v: v is not None and v["status"] == want and
                          self.model.timers[timer_id].current.status != want, False)  # fmt: skip
        elif reply.status == 200:
            if reply.body["status"] != self.model.timers[timer_id].current.status:
                self._changed(timer_id, reply.body, False)
        else:
            assert reply.status in (404, 409), reply.body

    def _reset(self, timer_id: str) -> None:
        """The plan restarts at the reset's time (``updated_at``: now, or just after the last
        fire), its count from 0; 400 for an ``at`` already past, 409 while a claim it meets
        stays unsent (its run stalled or died)."""
        sent_at = self.world.clock()
        reply = self._call("POST", f"/v1/timers/{timer_id}/reset", self.owner[timer_id])
        if reply is None:
            with self.world.observing():
                got = self.world.api.call(
                    "GET", f"/v1/timers/{timer_id}", tenant=self.owner[timer_id]
                )
            view = got.body if got.status == 200 else None
            if view is None or parse_ms(view["updated_at"]) < sent_at or view["fire_count"]:
                return  # it died before its transaction
        elif reply.status != 200:
            assert reply.status in (400, 404, 409), reply.body
            return
        else:
            view = reply.body
        self.model.reset(timer_id)
        self.anchors[timer_id] = parse_ms(view["updated_at"])
        self._changed(timer_id, view, False)

    def _run_now(self, timer_id: str) -> None:
        """One extra fire, sent before the answer (202) whatever the timer's status; 404 once
        deleted; 409 (concurrent_update) if changes kept coming."""
        before = len(self.model.sends)
        reply = self._call("POST", f"/v1/timers/{timer_id}/run", self.owner[timer_id])
        sent = self.model.sends[before:]  # only the request sends meanwhile
        if reply is not None and reply.status != 202:
            assert reply.status in (404, 409), reply.body
            assert reply.status == 409 or self.model.timers[timer_id].deleted_at is not None
        answered = reply.body["fire_id"] if reply is not None and reply.status == 202 else None
        self.model.ran_now(timer_id, sent, answered, died=reply is None)

    @rule(pick=picks, change=st.sampled_from(["schedule", "payload", "pause", "delete"]),
          which=schedules)  # fmt: skip
    def run_now_racing_a_change(self, pick: int, change: str, which: int) -> None:
        """A change commits between run now's read of the timer and its claim: the claim is
        made against the timer as it now is (a new schedule's positions are not taken, a
        deleted timer is not sent), never against the one it read."""
        timer_id = self._pick(pick)
        if timer_id is None or self.model.timers[timer_id].deleted_at is not None:
            return
        extras = self.world.api.runtime.service.extras
        assert extras is not None
        owner = extras.new_owner

        def racing() -> str:  # called once the timer was read, before the claim
            extras.new_owner = owner
            if change in ("pause", "delete"):
                self._act(timer_id, change)
            else:
                self._patch(timer_id, self._patches(timer_id, change, which))
            return owner()

        extras.new_owner = racing
        try:
            self._run_now(timer_id)
        finally:
            extras.new_owner = owner

    # ------------------------------------------------------------ groups

    def _group_operation(
        self, tenant: str, group: str, action: str, between: Callable[[], None] | None = None
    ) -> None:
        """Pause, resume or delete every timer of the group as the SDK does: call until
        ``done`` - a call that died is simply called again (a retry), ``between`` runs between
        calls (a create into the group). Then each timer's change is learned from what GET
        shows (the answer counts them, it does not name them): the model's revisions say that
        no fire claimed after a timer's change is sent."""
        method, path = ("DELETE", f"/v1/groups/{group}") if action == "delete" else \
            ("POST", f"/v1/groups/{group}/{action}")  # fmt: skip
        answers: list[dict[str, Any]] = []
        for _ in range(40):
            reply = self._call(method, path, tenant)
            if reply is not None and reply.status != 409:  # 409: a timer kept changing: again
                assert reply.status in (200, 404), reply.body
                if reply.status == 404:
                    break
                assert reply.body["action"] == action and reply.body["changed"] <= 2, reply.body
                answers.append(reply.body)
                if reply.body["done"]:
                    break
            if between is not None:
                between()
        else:
            raise AssertionError(f"a group operation never ended: {answers}")
        if os.environ.get("TIMERS_MACHINE_SHOW_GROUPS"):
            print(f"{tenant} {action} {group}: {[a['changed'] for a in answers]}", file=sys.stderr)
        self._learn_group(tenant, group, action)

    def _learn_group(self, tenant: str, group: str, action: str) -> None:
        want = {"pause": "paused", "resume": "active", "delete": None}[action]
        for timer_id, model in self.model.timers.items():
            if model.deleted_at is not None or self.group_of.get(timer_id) != group:
                continue
            with self.world.observing():
                got = self.world.api.call("GET", f"/v1/timers/{timer_id}",
                                          tenant=self.owner[timer_id])  # fmt: skip
            view = got.body if got.status == 200 else None
            status = None if view is None else view["status"]
            if self.owner[timer_id] != tenant:  # another tenant's group of the same name
                assert status is not None and (status == "paused") == (
                    model.current.status == "paused"
                ), f"another tenant's timer changed: {view}"
                continue
            if status == model.current.status or (view is not None and view["group"] != group):
                continue  # already so (or left the group meanwhile: not its business)
            assert status == want or status == "completed", (action, view, model.current)
            if status != "completed" or model.current.status == "paused":  # a resume ended it
                self._changed(timer_id, view, False)

    @rule(
        group=st.sampled_from(GROUPS),
        tenant=tenants,
        action=group_actions,
        die_at=st.none() | st.integers(0, 8),
        create_between=st.booleans(),
        which=schedules,
        pick=picks,
    )
    def group_operation(
        self, group: str, tenant: str, action: str, die_at: int | None, create_between: bool,
        which: int, pick: int,
    ) -> None:  # fmt: skip
        """A group operation, in steps of 2: dying at a DynamoDB call of a step (a crash
        between its writes) and called again, with a timer created into the group between
        steps (the operation may miss it; the model learns what it did)."""
        timer = self._pick(pick)  # mostly the group of a timer made so far
        if timer is not None and self.group_of.get(timer) is not None:
            tenant, group = self.owner[timer], str(self.group_of[timer])
        if die_at is not None:
            self.world.faults.armed.append(Fault("*", "kill", skip=die_at))
        created: list[int] = []

        def create_into_it() -> None:
            if not created:
                created.append(1)
                self.create(which, tenant, "fire_all", None, False, 0, group)

        try:
            self._group_operation(tenant, group, action, create_into_it if create_between
                                  else None)  # fmt: skip
        finally:
            self.world.faults.armed.clear()

    @rule(pick=picks, action=st.sampled_from(["pause", "resume", "delete", "reset", "run"]))
    def pause_resume_delete(self, pick: int, action: str) -> None:
        timer = self._pick(pick)
        if timer is not None and self.model.timers[timer].deleted_at is None:
            self._act(timer, action)

    # ------------------------------------------------------------ time and the functions

    @rule(ms=st.sampled_from([40, 200, 900, 2_500, 30_000, 70_000]))
    def outage(self, ms: int) -> None:
        """Time passes and nothing runs."""
        self.world.clock.advance(ms)

    @rule(ms=st.sampled_from([100, 600, 1_000, 3_000, 30_000, 70_000]), remaining_ms=remaining)
    def run_for_a_while(self, ms: int, remaining_ms: int) -> None:
        """The service runs as deployed for a while: the fan-out, its runs, the migrator on
        its minutes (faults armed meanwhile hit whatever comes first)."""
        self.world.run(ms, remaining_ms)

    @rule()
    def migrate(self) -> None:
        self.world.migrate()

    @rule(step=steps, remaining_ms=remaining)
    def trigger_dies(self, step: str, remaining_ms: int) -> None:
        """Every bucket with due work runs; each run dies at ``step``."""

        def hook(current: str) -> None:
            if current == step:
                raise Kill(step)

        for bucket in self.world.buckets_with_work():
            self.world.trigger(bucket, remaining_ms, hook)

    @rule(step=race_steps, pick=picks, claimed=st.booleans(), action=st.sampled_from(["name",
          "max_fires", "schedule", "pause", "resume", "delete", "end_at", "start_at", "flush",
          "none", "reset", "run", "group_pause", "group_delete", "group_resume"]),
          which=schedules, stall=st.sampled_from([0, 9_000, 15_000]), then_die=st.none() | steps,
          remaining_ms=remaining)  # fmt: skip
    def change_during_a_run(
        self, step: str, pick: int, claimed: bool, action: str, which: int, stall: int,
        then_die: str | None, remaining_ms: int,
    ) -> None:  # fmt: skip
        """While a run is at ``step``, a change lands - on the timer it just claimed, or on any
        - or Redis fails over; the run may then stall (a slow call: it sends late, or runs
        short of time and hands its work back) and may die, there or at a later step."""
        done: list[str] = []

        def hook(current: str) -> None:
            if current == step and not done:
                done.append(current)
                target = (self.world.last_claimed if claimed else None) or self._pick(pick)
                if action == "flush":
                    self.world.flushall()
                elif (action == "none" or target not in self.model.timers
                      or self.model.timers[target].deleted_at is not None):  # fmt: skip
                    pass
                elif action.startswith("group_"):  # the whole group of the target
                    if (group := self.group_of.get(target)) is not None:
                        self._group_operation(self.owner[target], group, action[6:])
                elif action in ("pause", "resume", "delete", "reset", "run"):
                    self._act(target, action)
                else:
                    self._patch(target, self._patches(target, action, which))
                self.world.clock.advance(stall)
            if done and current == then_die:
                raise Kill(current)

        for bucket in self.world.buckets_with_work():
            self.world.trigger(bucket, remaining_ms, hook)

    @rule(every=st.sampled_from([1, 3, 7]), bound=st.sampled_from(["max_fires", "end_at"]),
          more=st.sampled_from([3, 10]), tenant=tenants, then_die=st.none() | steps,
          remaining_ms=remaining)  # fmt: skip
    def more_granted_while_the_last_is_on_its_way(
        self, every: int, bound: str, more: int, tenant: str, then_die: str | None,
        remaining_ms: int,
    ) -> None:  # fmt: skip
        """Issue 16, defect 4's race, drawn on purpose (change_during_a_run meets it rarely): a
        timer whose first fire is its last (max_fires 1, or an end_at just past it) is given
        more fires while that fire is claimed and not yet sent - it must go on after it, from
        it; the run may then die."""
        now = self.world.clock()
        limits = {"max_fires": 1} if bound == "max_fires" else {
            "end_at": format_ms(now + every * 1_500)}  # fmt: skip
        body = {"schedule": {"type": "every", "seconds": every}, "payload": _payload(),
                "name": f"m{next(serial)}", **limits}  # fmt: skip
        reply = self._call("POST", "/v1/timers", tenant, body=body)
        if reply is None or reply.status != 201:
            self.model.maybe_payloads.add(payload_key(body["payload"]))
            return
        timer_id = self._learn(reply.body, tenant, now)
        raised: dict[str, Any] = (
            {"max_fires": more}
            if bound == "max_fires"
            else {"end_at": format_ms(now + every * 1_000 * more + 500)}
        )
        done: list[str] = []

        def hook(current: str) -> None:
            if current == "claimed" and not done and self.world.last_claimed == timer_id:
                done.append(current)
                self._patch(timer_id, raised)
            if done and current == then_die:
                raise Kill(current)

        for _ in range(3):  # its first fire comes due within 7 s: the runs reach it
            for bucket in self.world.buckets_with_work():
                self.world.trigger(bucket, remaining_ms, hook)
            if done:
                return

    @rule()
    def flushall(self) -> None:
        """A failover to an empty replica."""
        self.world.flushall()

    @rule(bucket=st.sampled_from([0, 1]))
    def lose_a_shard(self, bucket: int) -> None:
        """The shard holding one bucket came back empty; the other bucket is untouched."""
        self.world.lose_bucket(bucket)

    @rule(which=st.integers(0, 2))
    def kill_a_master(self, which: int) -> None:
        """(A Redis Cluster) a master dies and its replica takes over."""
        self.world.kill_a_master(which)

    @rule(bucket=st.sampled_from([0, 1]), runs_meanwhile=st.booleans())
    def move_a_bucket(self, bucket: int, runs_meanwhile: bool) -> None:
        """(A Redis Cluster) a reshard moves a bucket's slot, the service running meanwhile."""
        self.world.move_a_bucket(bucket, runs_meanwhile)

    @rule(which=st.integers(0, 2))
    def lose_a_shard_for_real(self, which: int) -> None:
        """(A Redis Cluster) a shard's master and replica come back empty."""
        self.world.lose_a_shard_for_real(which)

    @rule()
    def a_replica_starts_lagging(self) -> None:
        """From here on the replica misses every write: what it holds is this snapshot."""
        self.world.take_snapshot()

    @rule()
    def fail_over_to_the_lagging_replica(self) -> None:
        """The master dies; its replica, behind since its snapshot, takes over (every write
        since is lost) and the fan-out's next peek fails while it does."""
        self.world.fail_over_to_the_snapshot()

    @rule(commands=st.sampled_from([1, 3, 40]))
    def redis_outage(self, commands: int) -> None:
        """The next ``commands`` Redis commands of anyone fail (an api's fast path, a lease, a
        poll...): what they would have written lives only in DynamoDB."""
        self.world.outage.failing = commands

    @rule(operation=writes, kind=fault_kinds, skip=st.integers(0, 3))
    def dynamodb_fault(self, operation: str, kind: str, skip: int) -> None:
        """The next matching DynamoDB call (of anyone) fails this way."""
        self.world.faults.armed.append(Fault(operation, kind, skip))  # type: ignore[arg-type]

    @rule(offset=st.sampled_from([-1_500, -400, 0, 350, 1_800, 9_000]))
    def host_clock(self, offset: int) -> None:
        """The trigger hosts' wall clocks step by this much (never early must not care)."""
        self.world.host_offset_ms = offset

    @rule()
    def retention_passes(self) -> None:
        """When nothing is active: jump past the retention and let DynamoDB's TTL delete what
        expired (late, in any order). What stays must still read consistently. (Not a
        precondition: which rules may be drawn must not depend on the system's state.)"""
        timers = self.model.timers.values()
        if any(t.deleted_at is None and t.current.status == "active" for t in timers):
            return
        retention_ms = SETTINGS.fire_retention_days * DAY_MS
        self.world.clock.advance(retention_ms + 2 * DAY_MS)
        self.world.expire_ttl()
        self.model.retention_passed(self.world.clock(), retention_ms)

    # ------------------------------------------------------------ checks

    @invariant()
    def every_send_is_allowed(self) -> None:
        self.model.check_new_sends()

    @invariant()
    def leases_are_fair(self) -> None:
        assert not self.model.unfair, self.model.unfair[0]

    @invariant()
    def a_step_ends(self) -> None:
        """Every step so far ended (a loop that does not is a Runaway: RUNAWAY_CALLS); the
        next one gets a fresh count of DynamoDB calls."""
        self.world.faults.new_step()
        if os.environ.get("TIMERS_MACHINE_SHOW_CALLS"):
            print(f"most DynamoDB calls in a step: {self.world.faults.most}", file=sys.stderr)
        if os.environ.get("TIMERS_MACHINE_SHOW_FAULTS") and self.world.cluster_faults:
            print(f"cluster faults: {self.world.cluster_faults}", file=sys.stderr)
            self.world.cluster_faults = []

    @rule()
    def settle(self) -> None:
        start, end = self.world.settle(SETTLE_MS)
        self.model.check_new_sends()
        self.model.check_nothing_lost(start, end, SLACK_MS)
        for timer_id in self.model.timers:
            tenant = self.owner[timer_id]
            got = self.world.api.call("GET", f"/v1/timers/{timer_id}", tenant=tenant)
            assert got.status in (200, 404), got.body
            view = got.body if got.status == 200 else None
            history = self.world.history(timer_id, tenant) if view is not None else {}
            self.model.check_views(view, history, timer_id)


def _applied(view: dict[str, Any], body: dict[str, Any], sent_at: int) -> bool:
    """Whether a timer's view shows this PATCH body (an undecided request's outcome): changed
    by it (only changes move ``updated_at``; a body equal to what the timer already had says
    nothing) and showing it."""
    if parse_ms(view["updated_at"]) < sent_at:
        return False
    for name, value in body.items():
        if name == "schedule":
            if view["schedule"] != {**value, **({"timezone": "UTC"} if value["type"] == "cron"
                                                 else {})}:  # fmt: skip
                return False
        elif view[name] != value:
            return False
    return True


@pytest.fixture
def machine(
    redis_target: RedisTarget, dynamodb_endpoint: str | None, request: pytest.FixtureRequest
) -> Iterator[type[FirePathMachine]]:
    """On a redis-server and moto, or (make test-real) a 3+3 Redis Cluster - with the rules
    that kill a master, move a slot and lose a shard - and DynamoDB Local."""
    FirePathMachine.redis_at = redis_target
    FirePathMachine.dynamodb = dynamodb_endpoint
    FirePathMachine.cluster = request.getfixturevalue("redis_cluster") if redis_target.cluster \
        else None  # fmt: skip
    yield FirePathMachine


def test_the_fire_path_never_loses_duplicates_or_fires_early(
    machine: type[FirePathMachine],
) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=REAL_PARTS_EXAMPLES if machine.cluster or machine.dynamodb else EXAMPLES,
            stateful_step_count=30,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            derandomize=os.environ.get("TIMERS_MACHINE_RANDOM") is None,
            phases=PHASES if os.environ.get("TIMERS_MACHINE_SHRINK") != "0" else NO_SHRINK,
        ),
    )
