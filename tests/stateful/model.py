"""The reference model of the stateful test: what the service promises, in the simplest terms.

Each timer is a list of *revisions* - the plan, status, payload and name a successful request
gave it, and the span of time it was current. Every callback sent is checked against them as it
happens; at a *settle* point (faults off, the service left to run) the model says what must have
been sent and what GET and the fire history must show. The schedule math is the project's own
(``timers.core.schedule``), tested on its own against vectors; everything else here is new.

The rules, from docs/fire-path.md and the contract:

- never early: a callback is sent at or after its scheduled time;
- allowed: a fire is an occurrence of a revision that was current when the fire was *claimed*
  (changes win: a change orders itself before or after each claim), carrying the payload and
  name of a revision current by the time it was sent;
- once: a fire id is sent once, unless its run died between the send and the record (or its
  record could not be written): the documented duplicate window, counted;
- never lost: every claimed fire of a timer that still exists is sent (a claim is a promise);
  every occurrence of the current revision due after it began (past the arming window) is
  sent, all of them with ``fire_all``, those due while the service ran without faults with the
  other misfire policies, up to ``max_fires``;
- what GET and the fire history show is what was sent (the count: since the last reset);
- a reset restarts the plan from its answer: nothing claimed before it is sent after it;
- run now sends one fire of the timer as its request reads it, before it answers, counted in
  no fire count.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from timers.core.schedule import Misfire, Plan, first_fire, is_recurring, next_fire
from timers.engine.trigger import ARM_MS

WINDOW_SLACK_MS = 2_000
"""How far past its window's end a windowed fire may land while the service runs: a run's
start, lease, claim and send."""
CLAIM_EDGE_MS = 1
"""A claim and a change in the same millisecond of the injected clock may be in either order."""
RECOVERY_MS = 35_000
"""How long into a settle a run killed before it may still hold a position: its leases and
claims lapse ~3 s after its deadline (runs get 30 s). Until then a misfire policy other than
fire_all may rightly collapse what the timer missed."""


@dataclass
class Revision:
    plan: Plan
    status: str  # active | paused | completed
    payload: Any
    name: str | None
    misfire: Misfire
    since: int  # when it became current (its request's time)
    until: int | None = None  # when the next change replaced it
    window_ms: int = 0  # its flexible window: a fire lands in [due, due + window]

    def occurs(self, due: int) -> bool:
        if is_recurring(self.plan.schedule):
            return next_fire(self.plan, due - 1) == due
        return first_fire(self.plan) == due

    def occurrences(self, after: int, until: int) -> list[int]:
        """Occurrences in (after, until]."""
        out: list[int] = []
        if not is_recurring(self.plan.schedule):
            due = first_fire(self.plan)
            return [due] if due is not None and after < due <= until else []
        due = next_fire(self.plan, after)
        while due is not None and due <= until and len(out) < 10_000:
            out.append(due)
            due = next_fire(self.plan, due)
        return out


@dataclass
class ModelTimer:
    id: str
    revisions: list[Revision]
    deleted_at: int | None = None
    uncounted: set[str] = field(default_factory=set)  # fire ids sent before its last reset
    extras: set[str] = field(default_factory=set)  # fire ids of its run-now fires
    runs_died: int = 0  # run-now requests that got no answer (each may leave a claim pending)

    @property
    def current(self) -> Revision:
        return self.revisions[-1]

    def change(self, revision: Revision) -> None:
        self.current.until = revision.since
        self.revisions.append(revision)


@dataclass(frozen=True)
class Sent:
    fire_id: str
    timer_id: str
    due: int
    at: int  # the reference time of the send (what SentTimestamp shows)
    payload: Any
    name: str | None
    run: int  # the trigger run that sent it


@dataclass
class Model:
    timers: dict[str, ModelTimer] = field(default_factory=dict)
    maybe_payloads: set[str] = field(default_factory=set)  # creates whose outcome is unknown
    sends: list[Sent] = field(default_factory=list)
    claimed: dict[str, int] = field(default_factory=dict)  # fire id -> first claim time
    dup_ok: set[str] = field(default_factory=set)  # the documented duplicate window
    held_for: Callable[[str], str] = lambda timer_id: ""  # what the service holds for a timer
    history_from: int = 0  # fires due before this are past the retention: gone from history
    checked: int = 0  # sends checked so far
    unfair: list[str] = field(default_factory=list)  # leases that passed a tenant over

    # ------------------------------------------------------------ as things happen

    def check_new_sends(self) -> None:
        counts = Counter(s.fire_id for s in self.sends)
        for sent in self.sends[self.checked :]:
            assert sent.at >= sent.due, f"sent early: {sent}"
            assert counts[sent.fire_id] == 1 or sent.fire_id in self.dup_ok, (
                f"sent {counts[sent.fire_id]} times outside the duplicate window: {sent}"
            )
            timer = self.timers.get(sent.timer_id)
            if timer is None:  # a create that died: its timers are unknown, their payloads not
                assert payload_key(sent.payload) in self.maybe_payloads, (
                    f"a stranger's fire: {sent}"
                )
                continue
            if sent.fire_id in timer.extras:  # run now's: checked as its request ended
                continue
            claimed = self.claimed.get(sent.fire_id)
            assert claimed is not None, f"sent without a claim: {sent}"
            assert any(
                r.status == "active"
                and r.occurs(sent.due)
                and r.since - CLAIM_EDGE_MS <= claimed
                and (r.until is None or claimed <= r.until + CLAIM_EDGE_MS)
                for r in timer.revisions
            ), f"no revision current at its claim ({claimed}) fires it: {sent}\n{timer}"
            current_by_then = [r for r in timer.revisions if r.since <= sent.at]
            assert any(
                payload_key(r.payload) == payload_key(sent.payload) and r.name == sent.name
                for r in current_by_then
            ), f"payload or name of no revision: {sent}\n{timer}"
        self.checked = len(self.sends)

    # ------------------------------------------------------------ at a settle point

    def reset(self, timer_id: str) -> None:
        """A reset answered: every fire of the timer sent so far is no longer counted, and none
        of its claims may still be unsent (a reset waits for a claimed fire, never adopts it)."""
        timer = self.timers[timer_id]
        sent = self.sent_ids(timer_id)
        unsent = {f for f in self.claimed if f.rsplit(":", 1)[0] == timer_id} - sent
        assert not unsent, f"a reset answered while these claims were unsent: {sorted(unsent)}"
        timer.uncounted = sent

    def ran_now(
        self, timer_id: str, sent: list[Sent], fire_id: str | None, died: bool = False
    ) -> None:
        """A run-now request ended: ``sent`` is what it put on the queue, ``fire_id`` what it
        answered (None: it died, or was refused). An answered fire went exactly once, at its
        id; a request that died sent it once or not at all; a refused one sent nothing."""
        timer = self.timers[timer_id]
        timer.runs_died += died
        ids = [s.fire_id for s in sent]
        if fire_id is not None:
            assert ids == [fire_id], f"run now answered {fire_id}, sent {ids}"
        assert len(ids) <= 1 and all(s.timer_id == timer_id for s in sent), sent
        for s in sent:  # a change racing it came first (nothing else runs meanwhile)
            assert timer.deleted_at is None, f"a deleted timer was run now: {s}"
            assert payload_key(s.payload) == payload_key(timer.current.payload), (
                f"run now sent a payload of an older revision: {s}\n{timer}"
            )
            assert not timer.current.occurs(s.due), f"run now took a plan's position: {s}"
        timer.extras.update(ids)

    def sent_ids(self, timer_id: str) -> set[str]:
        return {s.fire_id for s in self.sends if s.timer_id == timer_id}

    def check_nothing_lost(self, settled_from: int, settled_to: int, slack_ms: int) -> None:
        """``settled_from..settled_to``: the service ran without faults in between."""
        sent_by_timer: dict[str, set[int]] = defaultdict(set)
        for s in self.sends:
            sent_by_timer[s.timer_id].add(s.due)
        for fire_id, at in self.claimed.items():
            timer_id = fire_id.rsplit(":", 1)[0]
            timer = self.timers.get(timer_id)
            if timer is not None and timer.deleted_at is None:
                assert fire_id in self.sent_ids(timer_id), (
                    f"claimed at {at} and never sent (a claim is a promise): {fire_id}"
                )
        horizon = settled_to - slack_ms
        for timer in self.timers.values():
            r = timer.current
            if timer.deleted_at is not None or r.status != "active":
                continue
            sent = sent_by_timer[timer.id]
            counted = {d for d in sent if f"{timer.id}:{d}" not in timer.uncounted | timer.extras}
            start = r.since + ARM_MS + CLAIM_EDGE_MS
            if r.misfire != "fire_all" and is_recurring(r.plan.schedule):
                start = max(start, settled_from + RECOVERY_MS)
            due = r.occurrences(start, horizon)
            if not is_recurring(r.plan.schedule):
                due = [d for d in (first_fire(r.plan),) if d is not None and d <= horizon]
            if r.plan.max_fires is not None:
                before = len({d for d in counted if d <= start})  # a reset counts anew
                room = max(0, r.plan.max_fires - before)
                assert len([d for d in due if d in sent]) >= min(room, len(due)), (
                    f"lost fires of {timer.id} (max_fires {r.plan.max_fires}): "
                    f"{sorted(set(due) - sent)[:room]}\n{timer}\n{self.held_for(timer.id)}"
                )
                continue
            missing = sorted(set(due) - sent)
            assert not missing, (
                f"lost fires of {timer.id}: {missing[:5]}...\n{timer}\n{self.held_for(timer.id)}"
            )
        self.check_windows(settled_from + RECOVERY_MS, horizon)

    def check_windows(self, settled_from: int, settled_to: int) -> None:
        """A fire of a timer with a window lands in [due, due + window] while the service runs
        without faults (the usual lateness aside: WINDOW_SLACK_MS)."""
        for s in self.sends:
            timer = self.timers.get(s.timer_id)
            if timer is None or not settled_from <= s.due <= settled_to:
                continue
            windows = [r.window_ms for r in timer.revisions if r.since <= s.due]
            if windows and windows[-1]:
                assert s.at <= s.due + windows[-1] + WINDOW_SLACK_MS, (
                    f"sent {s.at - s.due} ms after its due time, its window {windows[-1]} ms: {s}"
                )

    def check_views(
        self, view: dict[str, Any] | None, fires: dict[str, str], timer_id: str
    ) -> None:
        """GET and the fire history of a timer, after a settle (nothing in flight): every fire
        enqueued, but the claim of a run-now request that died before its record (maybe sent,
        maybe not: the request got no answer, and nothing sends it later)."""
        timer = self.timers[timer_id]
        if timer.deleted_at is not None:
            assert view is None, f"a deleted timer is still readable: {view}"
            return
        assert view is not None, f"a timer that exists answers 404: {timer}"
        sent = self.sent_ids(timer_id)
        counted = sent - timer.uncounted - timer.extras  # a reset counts anew; run now never
        assert view["fire_count"] == len(counted), (
            f"GET says {view['fire_count']} fires, {len(counted)} were sent since the last "
            f"reset: {view}\n{sorted(counted)}"
        )
        pending = {f for f, status in fires.items() if status == "pending"}
        assert len(pending) <= timer.runs_died and not pending & (sent - timer.extras), (
            f"pending after a settle: {sorted(pending)} ({timer.runs_died} run-now died)"
        )
        assert all(s == "enqueued" for f, s in fires.items() if f not in pending), fires
        history = set(fires) - (pending - sent)
        kept = {f for f in sent if int(f.rsplit(":", 1)[1]) >= self.history_from}
        assert kept <= history <= sent, (
            f"the fire history is not what was sent: {sorted(history)} vs {sorted(sent)}"
        )

    def retention_passed(self, now: int, retention_ms: int) -> None:
        """Completed timers expired (their TTL is their completion plus the retention) and so
        did every fire older than the retention."""
        self.history_from = now - retention_ms
        for timer in self.timers.values():
            if timer.deleted_at is None and timer.current.status == "completed":
                timer.deleted_at = now


def payload_key(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True)
