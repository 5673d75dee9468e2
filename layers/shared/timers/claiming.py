"""The trigger's claim phase: make each leased position ours, or learn why it is not.

A *fresh* member (the timer's current revision, the timer active) claims its position with
one conditional write per claim item and chunk - at the root of its path, or below the full
items of a hot second the store has seen - and a member of an older revision never creates a
claim (docs/fire-path.md, R2). When a write fails, one consistent read locates each entry -
through sealed items, down to its home - and :func:`timers.core.chain.decide_claim` sorts it
out: claim it at its home (sealing a full item on the way), take a lapsed claim over (keeping
the first claimant's decision: the fire is owed), wait for a live one, acknowledge a finished
one, or drop a stale member.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from botocore.exceptions import BotoCoreError, ClientError

from timers.adapters.claims import CHUNK, MAX_DEPTH, ClaimStore, chunks
from timers.core.chain import (
    LAPSE_MARGIN_MS,
    Entry,
    EntryRef,
    Member,
    Step,
    decide_claim,
    entry_for,
    entry_name,
    entry_ref,
)
from timers.core.timer import Timer
from timers.sending import Delivery

log = logging.getLogger(__name__)

CLAIM_ATTEMPTS = 3
"""Tries of one claim write (each up to the DynamoDB client's timeout) before its members are
given back."""

CLAIM_RETRY_MS = 1_000
"""A chunk whose claim writes kept failing is leasable again this much later: an error that
persists costs a write a second, not a tight loop."""

ITEM_WORKERS = 8
"""Claim items written in parallel (the chunks of one item go in turn: writes to one item
serialize anyway, and a conditional write that fails costs the item's size)."""


@dataclass
class Job:
    """One leased member on its way through a run."""

    member: Member
    timer: Timer  # the timer's data as this run knows it (its card): revision >= the member's
    fresh: bool  # of the timer's current revision, the timer active: may create a claim
    decided: Step | None = None  # what a fresh member fires (None for a stale one)
    entry: Entry | None = None  # what holds the position: ours, or the one found
    home: str | None = None  # the claim item the entry lives in (None: not located yet)
    delivery: Delivery | None = None  # once claimed: the callback on its way

    @property
    def name(self) -> str:
        return entry_name(self.timer.id, self.member.due)

    @property
    def root(self) -> EntryRef:
        """Where the entry's path starts (the claim item of its partition and second)."""
        return entry_ref(self.timer.partition, self.timer.id, self.member.due)

    @property
    def ref(self) -> EntryRef:
        """The entry at its home, once located (else at the root, where it usually is)."""
        return (self.home or self.root[0]), self.name

    @property
    def fire_ms(self) -> int:
        """The occurrence this position fires: its own, or the one a misfire decision chose."""
        if self.entry is not None:  # the claim's decision, whoever made it (a takeover keeps it)
            return self.entry.fired if self.entry.fired is not None else self.member.due
        fired = self.decided.fire_ms if self.decided is not None else None
        return fired if fired is not None else self.member.due

    @property
    def send_at(self) -> int:
        """Never before the position nor before the occurrence it fires."""
        return max(self.member.due, self.fire_ms)


@dataclass
class Claimed:
    """What a claim phase found: jobs ours to send (pending) or to finish (already finished),
    members to give back (leasable again from the score), and stale members to drop."""

    ours: list[Job] = field(default_factory=list)
    held: dict[Member, int] = field(default_factory=dict)
    stale: list[Member] = field(default_factory=list)
    given_back: int = 0  # claim writes that kept failing: their members go back at once
    taken_over: int = 0  # lapsed claims of dead runs taken over: maybe sent once already
    already_fired: int = 0

    def add(self, other: Claimed) -> None:
        self.ours += other.ours
        self.held.update(other.held)
        self.stale += other.stale
        self.given_back += other.given_back
        self.taken_over += other.taken_over
        self.already_fired += other.already_fired


@dataclass
class Claimer:
    claims: ClaimStore
    owner: str
    until: int  # the claims this run makes hold until then (its deadline)
    now: Callable[[], int]  # the reference time
    may_write: Callable[[], bool]  # whether a claim write can still finish before the deadline

    @property
    def chunk(self) -> int:
        """Entries per claim write: never more than a fresh item takes (an entry weighs <= 2)."""
        return min(CHUNK, self.claims.cap // 2)

    def claim(self, jobs: Sequence[Job]) -> Claimed:
        """Claim every fresh job's position; sort the stale ones out by what they find."""
        out = Claimed()
        by_item = self._by_home([j for j in jobs if j.fresh])
        if by_item:
            with ThreadPoolExecutor(max(1, min(ITEM_WORKERS, len(by_item)))) as pool:
                for part in pool.map(self._claim_item, by_item.items()):
                    out.add(part)
        stale = [j for j in jobs if not j.fresh]
        if stale:
            out.add(self._sort_out(stale))
        return out

    def _by_home(self, jobs: Sequence[Job]) -> dict[str, list[Job]]:
        """Fresh jobs by where their claim goes: the root of their path, or below the full
        items of a hot second seen already."""
        by_item: dict[str, list[Job]] = defaultdict(list)
        now = self.now()
        for job in {job.name: job for job in jobs}.values():
            by_item[self.claims.home_guess(job.ref, now)].append(job)
        return by_item

    def _claim_item(self, item: tuple[str, list[Job]]) -> Claimed:
        """A write per chunk at ``key``; once a write finds the item sealed (its read learns
        what the item holds), the rest go below it."""
        key, jobs = item
        out = Claimed()
        while jobs:
            chunk, jobs = jobs[: self.chunk], jobs[self.chunk :]
            out.add(self._claim_chunk(key, chunk))
            regrouped = self._by_home(jobs)
            if regrouped.keys() - {key}:
                for below in regrouped.items():
                    out.add(self._claim_item(below))
                break
        return out

    def _claim_chunk(self, key: str, jobs: list[Job], depth: int = 0) -> Claimed:
        """One conditional write for the chunk at ``key``, its home as far as we know; on
        failure, a read sorts it out. A write that times out is tried again with the same
        owner (a write applied despite the error is then found as ours), then its members are
        given back."""
        entries = {job.name: self._mine(job) for job in jobs}
        for attempt in range(CLAIM_ATTEMPTS):
            try:
                if self.claims.claim(key, entries):
                    for job in jobs:
                        job.entry, job.home = entries[job.name], key
                    return Claimed(ours=list(jobs))
                return self._sort_out(jobs, depth)
            except (BotoCoreError, ClientError):
                if attempt + 1 < CLAIM_ATTEMPTS and self.may_write():
                    log.warning("claim failed; retrying", exc_info=True)
                    continue
                log.warning("claim failed; members given back", exc_info=True)
        later = self.now() + CLAIM_RETRY_MS
        return Claimed(held={j.member: max(j.member.due, later) for j in jobs},
                       given_back=len(jobs))  # fmt: skip

    def _mine(self, job: Job) -> Entry:
        assert job.decided is not None
        return entry_for(job.decided, job.member, self.owner, self.until)

    def _sort_out(self, jobs: Sequence[Job], depth: int = 0) -> Claimed:
        """Locate each entry (consistent) and act on what is there."""
        out = Claimed()
        found = self.claims.locate([job.root for job in jobs], consistent=True, learn=True)
        now = self.now()
        to_claim: dict[str, list[Job]] = defaultdict(list)
        counts: dict[str, int] = {}  # attributes each home has taken already
        for job in jobs:
            at = found[job.root]
            job.home = at.key
            action = decide_claim(
                at.entry, rev=job.member.rev, fresh=job.fresh, owner=self.owner, now_ms=now
            )
            if action in ("claim", "take_over") and not self.may_write():
                out.held[job.member] = job.member.due  # one write per entry: mind the deadline
            elif action == "claim" and at.entry is None:
                to_claim[at.key].append(job)
                counts[at.key] = at.count
            elif action == "claim":  # over a fence of an older revision
                assert at.entry is not None
                self._take(job, self._mine(job), at.entry, out)
            elif action == "take_over":  # the claimant is gone; its decision stands
                assert at.entry is not None
                taken = replace(at.entry, owner=self.owner, until=self.until)
                if self._take(job, taken, at.entry, out):
                    out.taken_over += 1
            elif action in ("ours", "done"):
                job.entry = at.entry
                out.ours.append(job)
                out.already_fired += action == "done"
            elif action == "wait":  # back when that claim lapses (not before the next window)
                assert at.entry is not None
                lapse = (at.entry.until or 0) + LAPSE_MARGIN_MS
                out.held[job.member] = max(lapse, now + 1)
            else:
                out.stale.append(job.member)
        for key, group in to_claim.items():
            if depth > MAX_DEPTH + 1:  # cannot happen while seals only go down; never loop
                out.held.update({j.member: j.member.due for j in group})
                continue
            if counts[key] + len(group) > self.claims.cap:
                self.claims.seal(key)  # no room: its positions' homes are below it from now on
                out.add(self._sort_out(group, depth + 1))
                continue
            for chunk in chunks({j.name: j for j in group}, self.chunk):
                out.add(self._claim_chunk(key, list(chunk.values()), depth + 1))
        return out

    def _take(self, job: Job, entry: Entry, old: Entry, out: Claimed) -> bool:
        assert job.home is not None
        if self.claims.take_over(job.home, job.name, entry, old):
            job.entry = entry
            out.ours.append(job)
            return True
        out.held[job.member] = job.member.due  # raced: look again at once
        return False
