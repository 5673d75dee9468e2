"""Timers in bulk, as JSON Lines: ``timers export`` writes one timer per line, ``timers import``
creates them through the batch endpoint.

A line is the body ``POST /v1/timers`` takes, plus three keys export writes and import reads:
``id`` (the exported timer's, for the summary; the service assigns new ids), ``status`` and
``fire_count``. So an export is an import's input, and a hand-written file needs only create
bodies.

An import never fires again what already fired - as a scheduler's or a task queue's user
expects of moving schedules (EventBridge Scheduler and Cloud Tasks move what is still to run,
not what has run): a ``completed`` timer is skipped (reported, not created), a recurring timer
part-way through its ``max_fires`` is created with the fires it has left, a ``paused`` one is
paused again once created. A webhook's header values are not in an export (the API shows them
masked): such a line is refused, naming the header, until its value is written in.

Import sends up to 100 lines per request, all or nothing on the service's side; a line the
service refuses is named by its 400's ``details`` (``timers[3].schedule``), set aside with its
reason, and the rest of its batch sent again - so every good line is created and every bad
one reported. Each batch carries an idempotency key made from its content: an import run
again within 24 h creates nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from timers_client.client import TIMER_FIELDS
from timers_client.errors import ApiError
from timers_client.models import Timer

BATCH = 100  # the batch endpoint's limit
EXPORT_ONLY = ("id", "status", "fire_count")
_INDEX = re.compile(r"timers\[([0-9]+)\]\.?(.*)")


def export_line(timer: Timer, default_queue: str | None) -> str:
    """One timer as an import line. An ``after`` schedule is relative to its create, so it is
    written as the ``at`` it stands for; the tenant's own queue is left implicit, so the line
    imports into another tenant or deployment too."""
    line: dict[str, Any] = {"id": timer.id}
    for name in TIMER_FIELDS:  # what a create sets
        value = getattr(timer, name)
        if value is not None and (name, value) != ("window_seconds", 0):  # 0 is the default
            line[name] = value
    if timer.schedule.get("type") == "after" and timer.next_fire_at:
        line["schedule"] = {"type": "at", "at": timer.next_fire_at}
    if timer.target == {"queue_url": default_queue}:
        del line["target"]
    line["status"] = timer.status
    line["fire_count"] = timer.fire_count
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, in the file
    body: dict[str, Any]  # the create body
    was: str | None  # the exported timer's id
    paused: bool


@dataclass
class ImportReport:
    created: list[tuple[Line, Timer]] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    skipped: list[tuple[int, str | None]] = field(default_factory=list)  # (line, was): completed

    @property
    def total(self) -> int:
        return len(self.created) + len(self.failed) + len(self.skipped)


def parse_lines(text_lines: Iterable[str], report: ImportReport) -> Iterator[Line]:
    """The file's timers still to fire; a line that is not a JSON object is reported, a
    completed timer skipped, blank lines ignored."""
    for number, text in enumerate(text_lines, start=1):
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except ValueError as exc:
            report.failed.append((number, f"not JSON: {exc}"))
            continue
        if not isinstance(data, dict):
            report.failed.append((number, "not a JSON object"))
            continue
        status = data.pop("status", None)
        if status not in (None, "active", "paused", "completed"):
            report.failed.append((number, f"status: {status!r} is not a timer status"))
            continue
        fired = data.pop("fire_count", 0)
        if isinstance(fired, bool) or not isinstance(fired, int) or fired < 0:
            report.failed.append((number, f"fire_count: {fired!r} is not a count of fires"))
            continue
        was = data.pop("id", None)
        was = was if isinstance(was, str) else None
        left = _fires_left(data.get("max_fires"), fired)
        schedule = data.get("schedule")
        one_shot = isinstance(schedule, dict) and schedule.get("type") in ("at", "after")
        if status == "completed" or left == 0 or (one_shot and fired):
            report.skipped.append((number, was))  # it fired all it will: never again
            continue
        if left is not None:
            data["max_fires"] = left
        yield Line(number, data, was, status == "paused")


def _fires_left(max_fires: Any, fired: int) -> int | None:
    """What a recurring timer has left of its ``max_fires`` (None: no cap, or not a number -
    the service says what is wrong with it)."""
    if isinstance(max_fires, bool) or not isinstance(max_fires, int):
        return None
    return max(max_fires - fired, 0)


def batches(lines: Iterable[Line], size: int = BATCH) -> Iterator[list[Line]]:
    batch: list[Line] = []
    for line in lines:
        batch.append(line)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def idempotency_key(batch: list[Line]) -> str:
    content = json.dumps([line.body for line in batch], sort_keys=True).encode()
    return "import:" + hashlib.sha256(content).hexdigest()[:40]


def refused_lines(error: ApiError, batch: list[Line]) -> dict[int, str]:
    """Which lines of ``batch`` a 400 names (index in the batch -> why); empty when it names
    none (then the whole batch failed for one reason)."""
    refused: dict[int, str] = {}
    for detail in error.details:
        if match := _INDEX.fullmatch(detail.field):
            index = int(match.group(1))
            if index < len(batch):
                where = f"{match.group(2)}: " if match.group(2) else ""
                refused.setdefault(index, "")
                refused[index] += ("; " if refused[index] else "") + where + detail.message
    return refused


def import_batch(
    batch: list[Line],
    create: Callable[[list[dict[str, Any]], str], list[Timer]],
    pause: Callable[[str], Any],
    report: ImportReport,
) -> None:
    """Create ``batch``; lines the service refuses are reported, the others created."""
    while batch:
        try:
            timers = create([line.body for line in batch], idempotency_key(batch))
        except ApiError as error:
            refused = refused_lines(error, batch) if error.status in (400, 413) else {}
            if not refused:  # nothing to single out: the batch fails as one
                report.failed += [(line.number, str(error)) for line in batch]
                return
            report.failed += [(batch[i].number, why) for i, why in sorted(refused.items())]
            batch = [line for i, line in enumerate(batch) if i not in refused]
            continue
        for line, timer in zip(batch, timers, strict=True):
            if line.paused and timer.status != "paused":
                timer = pause(timer.id)
            report.created.append((line, timer))
        return
