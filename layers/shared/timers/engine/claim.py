"""The claim: a run's leased cards as jobs, and their positions claimed in the fire log with
conditional writes - a fresh claim, a takeover of a lapsed one, or a wait (R1, R2, "Once" and
"Claim items stay small" in docs/fire-path.md)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from botocore.exceptions import BotoCoreError, ClientError

from timers.core.timer import Timer
from timers.engine.callbacks import Delivery
from timers.engine.entries import (
    Entry,
    EntryRef,
    Step,
    decide_claim,
    entry_for,
    misfire_grace_ms,
    ref_of,
    step,
)
from timers.engine.index import Card
from timers.engine.log import CHUNK, MAX_DEPTH, FireLog, chunks

log = logging.getLogger(__name__)

ARM_MS = 250  # lease and claim what falls due this far ahead (a score is leased ARM_MS early)
DYNAMO_CALL_MS = 3_500  # worst case of one claim or read: 0.5 s connect + 3 s read
CLAIM_ATTEMPTS = 3  # tries of one claim write before its cards are given back
CLAIM_RETRY_MS = 1_000  # a chunk whose claims kept failing is leasable again this much later
ITEM_WORKERS = 8  # fire-log items claimed in parallel (one item's chunks go in turn)
TAKE_CHUNK = 25  # entries one take-over write replaces (its condition names each one)


@dataclass
class Job:
    """One leased card on its way through a run."""

    card: Card
    fresh: bool  # the timer active at the card's revision: may create a claim (R2)
    decided: Step | None = None  # what a fresh card fires
    entry: Entry | None = None  # what holds the position: ours, or the one found
    home: str | None = None  # the fire-log item the entry lives in, once located
    delivery: Delivery | None = None

    @classmethod
    def of(cls, card: Card, now: int) -> Job:
        """A leased card's job: *fresh* if its timer is active, and then decided now (the
        misfire policy); any other only takes over, waits for or acknowledges a claim (R2)."""
        fresh = card.timer.status == "active"
        grace = misfire_grace_ms(card.timer)  # a fire within its window is on time
        decided = step(card.timer, card.pos, card.n, max(now, card.pos), grace) if fresh else None
        return cls(card, fresh, decided)

    @property
    def timer(self) -> Timer:
        return self.card.timer

    @property
    def name(self) -> str:
        return self.root[1]

    @property
    def root(self) -> EntryRef:
        return ref_of(self.timer, self.card.pos)

    @property
    def ref(self) -> EntryRef:
        return (self.home or self.root[0]), self.name

    @property
    def fire_ms(self) -> int:
        """The occurrence fired: the claim's decision, whoever made it (a takeover keeps it)."""
        if self.entry is not None:
            return self.entry.fired if self.entry.fired is not None else self.card.pos
        fired = self.decided.fire_ms if self.decided is not None else None
        return fired if fired is not None else self.card.pos

    @property
    def send_at(self) -> int:
        return max(self.card.due_at, self.fire_ms)

    @property
    def done(self) -> Entry:
        """The entry, once the job has one (claimed, found, or recorded)."""
        assert self.entry is not None
        return self.entry


def due_again(jobs: Sequence[Job], later: int | None = None) -> dict[Card, int]:
    """The jobs' cards, leasable again from their send instants (or ``later``)."""
    return {j.card: j.card.due_at if later is None else max(j.card.due_at, later) for j in jobs}


class Take(NamedTuple):
    """An entry to take over: a fence of an older revision, or a lapsed claim."""

    job: Job
    mine: Entry
    old: Entry


@dataclass
class Claimed:
    ours: list[Job] = field(default_factory=list)  # pending: to send; finished: to chain
    held: dict[Card, int] = field(default_factory=dict)  # leasable again from the score
    stale: list[Card] = field(default_factory=list)
    given_back: int = 0
    taken_over: int = 0
    already_fired: int = 0

    @classmethod
    def given(cls, jobs: Sequence[Job], later: int | None = None) -> Claimed:
        """Not claimed (no time, or the writes kept failing): the cards go back."""
        return cls(held=due_again(jobs, later), given_back=len(jobs))

    def add(self, other: Claimed) -> None:
        self.ours += other.ours
        self.held.update(other.held)
        self.stale += other.stale
        self.given_back += other.given_back
        self.taken_over += other.taken_over
        self.already_fired += other.already_fired


@dataclass
class Claimer:
    """A fresh card claims its position with one conditional write per item and chunk (at the
    root of its path, or below the full items seen); when a write fails, one consistent read
    locates each entry and :func:`decide_claim` sorts it out (R1, R2)."""

    log: FireLog
    owner: str
    until: int  # the claims hold until then (the run's deadline)
    now: Callable[[], int]
    may_write: Callable[[], bool]

    @property
    def chunk(self) -> int:
        return min(CHUNK, self.log.cap)

    def claim(self, jobs: Sequence[Job]) -> Claimed:
        out = Claimed()
        by_item = self._by_home([j for j in jobs if j.fresh])
        if by_item:
            with ThreadPoolExecutor(max(1, min(ITEM_WORKERS, len(by_item)))) as pool:
                for part in pool.map(self._claim_item, by_item.items()):
                    out.add(part)
        if stale := [j for j in jobs if not j.fresh]:
            out.add(self._sort_out(stale))
        return out

    def _by_home(self, jobs: Sequence[Job]) -> dict[str, list[Job]]:
        by_item: dict[str, list[Job]] = defaultdict(list)
        now = self.now()
        for job in {job.name: job for job in jobs}.values():
            by_item[self.log.home_guess(job.ref, now)].append(job)
        return by_item

    def _claim_item(self, item: tuple[str, list[Job]]) -> Claimed:
        key, jobs = item
        out = Claimed()
        while jobs:
            chunk, jobs = jobs[: self.chunk], jobs[self.chunk :]
            out.add(self._claim_chunk(key, chunk))
            regrouped = self._by_home(jobs)  # a write that found the item sealed learnt it
            if regrouped.keys() - {key}:
                for below in regrouped.items():
                    out.add(self._claim_item(below))
                break
        return out

    def _claim_chunk(self, key: str, jobs: list[Job], depth: int = 0) -> Claimed:
        """One conditional write; on failure, a read sorts it out. A write that times out is
        tried again with the same owner (one applied despite the error is then ours)."""
        if self.log.surely_full(key, len(jobs)):  # a write would be refused: sorted out at once
            return self._sort_out(jobs, depth)
        entries = {job.name: self._mine(job) for job in jobs}
        for attempt in range(CLAIM_ATTEMPTS):
            if not self.may_write():  # no time for it: the cards go back as they were
                return Claimed.given(jobs)
            seen: dict[str, Any] = {}  # the item as it stood, if the claim is refused
            try:
                if self.log.claim(key, entries, seen):
                    for job in jobs:
                        job.entry, job.home = entries[job.name], key
                    return Claimed(ours=list(jobs))
                return self._sort_out(jobs, depth, seen)
            except (BotoCoreError, ClientError):
                if attempt + 1 < CLAIM_ATTEMPTS:
                    log.warning("claim failed; retrying", exc_info=True)
                    continue
                log.warning("claim failed; cards given back", exc_info=True)
        return Claimed.given(jobs, later=self.now() + CLAIM_RETRY_MS)

    def _mine(self, job: Job) -> Entry:
        assert job.decided is not None
        c = job.card
        return entry_for(job.decided, c.timer.rev, c.pos, c.pv, self.owner, self.until)

    def _sort_out(
        self, jobs: Sequence[Job], depth: int = 0, seen: dict[str, Any] | None = None
    ) -> Claimed:
        """Locate each entry (one consistent read, less what a refused claim returned) and
        decide: claim, take over (one write per item), wait, or drop."""
        out = Claimed()
        if not self.may_write():  # no time to look: back as they were
            return Claimed.given(jobs)
        roots = [job.root for job in jobs]
        found = self.log.locate(roots, consistent=True, learn=True, seen=seen)
        now = self.now()
        to_claim: dict[str, list[Job]] = defaultdict(list)
        to_take: dict[str, list[Take]] = defaultdict(list)
        counts: dict[str, int] = {}
        for job in jobs:
            at = found[job.root]
            job.home = at.key
            action = decide_claim(
                at.entry, rev=job.timer.rev, fresh=job.fresh, owner=self.owner, now_ms=now
            )
            if action in ("claim", "take_over") and not self.may_write():
                out.held[job.card] = job.card.due_at
            elif action == "claim" and at.entry is None:
                to_claim[at.key].append(job)
                counts[at.key] = at.count
            elif action == "claim":  # over a fence of an older revision
                assert at.entry is not None
                to_take[at.key].append(Take(job, self._mine(job), at.entry))
            elif action == "take_over":  # the claimant is gone; its decision stands
                assert at.entry is not None
                mine = replace(at.entry, owner=self.owner, until=self.until)
                to_take[at.key].append(Take(job, mine, at.entry))
            elif action in ("ours", "done"):
                job.entry = at.entry
                out.ours.append(job)
                out.already_fired += action == "done"
            elif action == "wait":  # leased again once that claim lapsed, not ARM_MS before
                assert at.entry is not None
                out.held[job.card] = at.entry.lapses_at + ARM_MS
            else:
                out.stale.append(job.card)
        for key, takes in to_take.items():
            for start in range(0, len(takes), TAKE_CHUNK):
                self._take(key, takes[start : start + TAKE_CHUNK], out)
        for key, group in to_claim.items():
            full = counts[key] + len(group) > self.log.cap
            # depth: cannot happen while seals only go down; never loop. A seal takes time too.
            if depth > MAX_DEPTH + 1 or (full and not self.may_write()):
                out.held.update(due_again(group))
            elif full:
                self.log.seal(key)  # no room: its positions' homes are below it from now on
                out.add(self._sort_out(group, depth + 1))
            else:
                for chunk in chunks({j.name: j for j in group}, self.chunk):
                    out.add(self._claim_chunk(key, list(chunk.values()), depth + 1))
        return out

    def _take(self, key: str, takes: Sequence[Take], out: Claimed) -> None:
        """Take the entries over in one write, all as read; if one changed meanwhile, each on
        its own (a raced one goes back, to be looked at again at once)."""
        if not self.may_write():
            out.held.update(due_again([t.job for t in takes]))
            return
        if len(takes) > 1 and not self.log.take_over_many(
            key, {t.job.name: (t.mine, t.old) for t in takes}
        ):
            for take in takes:
                self._take(key, [take], out)
            return
        if len(takes) == 1 and not self.log.take_over(key, takes[0].job.name, *takes[0][1:]):
            out.held.update(due_again([takes[0].job]))
            return
        for take in takes:
            take.job.entry = take.mine
            out.ours.append(take.job)
            out.taken_over += take.old.state == "p"
