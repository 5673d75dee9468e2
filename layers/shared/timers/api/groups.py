"""Use cases of a tenant's groups: list them, and pause, resume or delete every timer of one.

A group operation changes each timer exactly as the single route does - ``Changes.change`` with
the same ``timers.pause`` / ``timers.resume`` / delete - so each timer's change is one
transaction ordered with the claim of its cursor (docs/fire-path.md, R5): a fire not yet
claimed when it commits never fires after it, a claimed one is owed as today. The operation
reads only the group's timers (the timers table's group index), a bounded slice per call; where
a call stopped is kept in the group's record, so the caller's next call goes on from there.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from timers.api.cursors import decode_cursor, encode_cursor
from timers.api.groups_table import GroupRecord, GroupStore
from timers.core import timer as timers
from timers.core.errors import ConcurrentUpdate, InvalidInput, InvalidState, NotFound
from timers.core.groups import ACTIONS, Action, check_name
from timers.core.timer import Timer
from timers.core.times import format_ms
from timers.engine.changes import CREATE_MS, Changes
from timers.tenancy.table import Tenant

log = logging.getLogger(__name__)

CHANGE_LIMIT = 500
"""Timers one call changes at most (the contract's)."""
READ_LIMIT = 2_000
"""Timers one call goes through at most (those already in the asked state included)."""
PAGE = 100
"""Ids read from the index at a time."""
CHUNK = 16
"""Changes run side by side (by WORKERS), between two looks at the time left."""
BUDGET_MS = 5_000
"""A call starts no chunk it would not end by this, judged by twice its slowest chunk so far (a
store under load slows down mid-call): it answers well within the api's 10 s timeout."""
GOES_ON_MS = 60_000
"""A call within this of the last unfinished call of the same action on the group goes on
after where that one stopped; later, or another action, starts from the group's first timer."""
WORKERS = 8
"""Changes of one chunk in flight at once (each is a few DynamoDB round trips)."""
LIST_READ_LIMIT = 200
"""Group records one listing request reads at most (a page may be short, with a cursor)."""
MEMBERS_CHECKED = 25
"""A listing checks this many index entries for a live member before calling a group alive."""

_CHANGES: dict[str, Callable[[Timer, int], Timer] | None] = {
    "pause": timers.pause,
    "resume": timers.resume,
    "delete": None,
}


@dataclass
class GroupService:
    changes: Changes
    groups: GroupStore
    clock: Callable[[], int]
    workers: int = WORKERS
    change_limit: int = CHANGE_LIMIT
    read_limit: int = READ_LIMIT
    budget_ms: int = BUDGET_MS
    chunk: int = CHUNK

    @property
    def timers(self) -> Any:
        return self.changes.timers

    # ---------------------------------------------------------------- list

    def list(self, tenant: Tenant, limit: int, cursor: str | None) -> dict[str, Any]:
        """A page of the tenant's groups by name: those with a timer in them. A record whose
        group emptied is deleted once older than a create in flight (its timer may be on its
        way: the record is written first)."""
        after = decode_cursor(cursor, tenant, "groups")
        shown: list[GroupRecord] = []
        read = 0
        while len(shown) < limit and read < LIST_READ_LIMIT:
            records, next_after = self.groups.page(tenant.name, after, limit - len(shown))
            read += len(records)
            for record in records:
                if self._has_timers(record):
                    shown.append(record)
                elif self.clock() - record.seen_ms > CREATE_MS:
                    self.groups.forget(record)
            after = next_after
            if after is None:
                break
        return {
            "items": [{"name": r.name, "created_at": format_ms(r.created_ms)} for r in shown],
            "next_cursor": encode_cursor(after, tenant, "groups"),
        }

    def _has_timers(self, record: GroupRecord) -> bool:
        ids, more = self.timers.group_ids(record.tenant, record.name, None, MEMBERS_CHECKED)
        if not ids:
            return False
        found = self.timers.get_many([(record.tenant, i) for i in ids])
        # index entries of expired or departed timers only, and more beyond: assume one lives
        return more or any(t.group == record.name for t in found.values())

    # ---------------------------------------------------------------- operations

    def operate(self, tenant: Tenant, name: str, action: Action) -> dict[str, Any]:
        """Up to CHANGE_LIMIT timers of the group through ``action``, within READ_LIMIT and
        BUDGET_MS; ``done`` once the group's last timer is through. 404: the tenant has no
        timer in a group of that name."""
        check_name(name)
        if action not in ACTIONS:
            raise InvalidInput(f"no group action {action!r}")
        start = self.clock()
        record = self.groups.get(tenant.name, name)
        after = None
        if (
            record is not None
            and record.op == action
            and record.op_ms is not None
            and start - record.op_ms <= GOES_ON_MS
        ):
            after = record.op_after
        from_first = after is None
        changed = read = 0
        done = False
        slowest = 0  # ms: the longest chunk of this call so far
        ahead: builtins.list[str] = []  # ids read from the index, not yet gone through
        more = True
        while True:
            began = self.clock()
            if not ahead and more:
                size = min(PAGE, self.change_limit - changed, self.read_limit - read)
                ahead, more = self.timers.group_ids(tenant.name, name, after, size)
                if from_first and read == 0 and not ahead:
                    self._gone(record)
                    raise NotFound(f"no group {name!r}")
            size = min(self.chunk, self.change_limit - changed)
            ids, ahead = ahead[:size], ahead[size:]
            outcome, through = self._chunk(tenant.name, name, action, ids)
            changed += outcome
            read += len(through)
            slowest = max(slowest, self.clock() - began)
            if through:
                after = through[-1]
            if len(through) < len(ids):  # a change kept failing: stop before it
                if changed == 0 and not through:
                    raise ConcurrentUpdate("a timer of the group kept changing; try again")
                break
            if not more and not ahead:
                done = True
                break
            if (
                changed >= self.change_limit
                or read >= self.read_limit
                or self.clock() - start + 2 * slowest > self.budget_ms  # room for a slower one
            ):
                break
        if done:
            self.groups.finished(tenant.name, name)
            if action == "delete" and record is not None:
                self._gone(record)
        elif after is not None:
            self.groups.progress(tenant.name, name, action, after, self.clock())
        return {"group": name, "action": action, "changed": changed, "done": done}

    def _gone(self, record: GroupRecord | None) -> None:
        """The group has no timer: its record goes, unless a timer may be joining it now."""
        if record is not None and self.clock() - record.seen_ms > CREATE_MS:
            self.groups.forget(record)

    def _chunk(
        self, tenant: str, name: str, action: Action, ids: Sequence[str]
    ) -> tuple[int, builtins.list[str]]:
        """Each timer's change, side by side; how many changed, and the ids gone through - all
        of them, or those before the first whose change failed."""
        if not ids:
            return 0, []
        # the chunk's timers and their walks read together (a few batch reads for all of
        # them, not a few per timer); each change then commits against what is stored
        stored = self.timers.get_many([(tenant, i) for i in ids])
        found = [stored[(tenant, i)] for i in ids if (tenant, i) in stored]
        reads = dict(zip([t.id for t in found], zip(found, self.changes.walks(found, True),
                                                    strict=True), strict=True))  # fmt: skip

        def one(timer_id: str) -> bool | BaseException:
            if timer_id not in reads:
                return False  # gone already: nothing to change
            try:
                return self._one(tenant, name, action, timer_id, reads[timer_id])
            except ConcurrentUpdate as exc:
                return exc

        if self.workers > 1 and len(ids) > 1:
            with ThreadPoolExecutor(min(self.workers, len(ids))) as pool:
                results = list(pool.map(one, ids))
        else:
            results = [one(i) for i in ids]
        changed = 0
        through: builtins.list[str] = []
        for timer_id, result in zip(ids, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("a group change kept failing", extra={"timer": timer_id})
                break
            changed += result
            through.append(timer_id)
        # changes after a failed one still count: they are made
        changed += sum(r is True for r in results[len(through) + 1 :])
        return changed, through

    def _one(self, tenant: str, name: str, action: Action, timer_id: str, read: Any = None) -> bool:
        """The single route's change of one timer, if it is still in the group; whether it
        changed it (a timer already in the asked state, completed or gone: not)."""

        def in_group(stored: Timer) -> bool:
            return stored.group == name

        change = _CHANGES[action]
        if change is None:
            try:
                self.changes.change(tenant, timer_id, None, only_if=in_group, read=read)
            except NotFound:
                return False
            return True
        moved: builtins.list[bool] = []

        def counted(timer: Timer, now: int) -> Timer:
            assert change is not None
            after = change(timer, now)
            moved.append(after is not timer)  # the committing attempt's is the last
            return after

        try:
            self.changes.change(tenant, timer_id, counted, only_if=in_group, read=read)
        except (NotFound, InvalidState):  # gone or left; completed (cannot be paused or resumed)
            return False
        return bool(moved and moved[-1])
