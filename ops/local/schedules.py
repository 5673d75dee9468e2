"""The template's EventBridge schedules, run on time by one thread.

``rate(...)`` schedules run at once when the stack is ready (so the fan-out ticks from the
first second, not from the next minute), then every period. ``cron(...)`` schedules run at
their matches, in UTC as EventBridge evaluates them.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from cronsim import CronSim

from ops.local.spec import ACCOUNT, ScheduleSpec, TemplateError

_UNIT_S = {"minute": 60, "hour": 3600, "day": 86400}
_AWS_DOW = {str(n): str(n - 1) for n in range(1, 8)}  # EventBridge 1-7 = SUN-SAT; cron 0-6


def next_run(expression: str, after: float, first: bool = False) -> float:
    """Epoch seconds of the next run strictly after ``after`` (``first``: the stack's start)."""
    rate = re.fullmatch(r"rate\((\d+) (minute|hour|day)s?\)", expression.strip())
    if rate:
        return after if first else after + int(rate.group(1)) * _UNIT_S[rate.group(2)]
    cron = re.fullmatch(r"cron\((.+)\)", expression.strip())
    if cron:
        start = datetime.fromtimestamp(after, UTC).replace(microsecond=0)
        return next(CronSim(_unix_cron(cron.group(1)), start)).timestamp()
    raise TemplateError(f"schedule {expression!r}: expected rate(N unit) or cron(...)")


def _unix_cron(fields: str) -> str:
    """EventBridge's six cron fields as the five unix ones: ``?`` is ``*``, the year goes,
    and numeric days of the week shift down by one."""
    parts = fields.split()
    if len(parts) != 6:
        raise TemplateError(f"cron({fields}): EventBridge cron has six fields")
    minute, hour, dom, month, dow, _year = (p.replace("?", "*") for p in parts)
    dow = re.sub(r"\b[1-7]\b", lambda m: _AWS_DOW[m.group(0)], dow)
    return f"{minute} {hour} {dom} {month} {dow}"


def scheduled_event(schedule: ScheduleSpec, region: str, at: float) -> Any:
    """What EventBridge sends: the template's Input if it fixes one, else a Scheduled Event."""
    if schedule.input is not None:
        return json.loads(schedule.input)
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:events:{region}:{ACCOUNT}:rule/{schedule.name}"],
        "detail": {},
    }


class Scheduler:
    """Calls ``fire(schedule, at)`` for each schedule when it is due, until stopped."""

    def __init__(
        self,
        schedules: list[ScheduleSpec],
        fire: Callable[[ScheduleSpec, float], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fire = fire
        self._clock = clock
        self._stop = threading.Event()
        now = clock()
        self._due = {s: next_run(s.expression, now, first=True) for s in schedules}
        self.thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def run_due(self) -> float:
        """Fire what is due now; return the epoch second of the next run."""
        now = self._clock()
        for schedule, at in list(self._due.items()):
            if at <= now:
                self._fire(schedule, at)
                following = next_run(schedule.expression, at)
                while following <= now:  # after a stall, run once - EventBridge never backfills
                    following = next_run(schedule.expression, following)
                self._due[schedule] = following
        return min(self._due.values(), default=now + 3600)

    def _loop(self) -> None:
        while not self._stop.is_set():
            wake = self.run_due()
            self._stop.wait(max(0.0, wake - self._clock()))
