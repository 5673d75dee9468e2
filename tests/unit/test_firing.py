"""The pure parts of sending a fire: the trigger's reference clock (``ClockSync``), its lag
buckets, and the callback body. (They were tested beside the chain rules in test_chain.py.)"""

from __future__ import annotations

import json
from dataclasses import replace

from tests.support.clock import T0
from timers.core import timer as timers
from timers.core.clock import ClockSync
from timers.core.schedule import AtSchedule
from timers.engine.callbacks import callback_body


def test_the_clock_is_corrected_by_the_reference_and_bounded_by_its_error() -> None:
    host = [T0 + 300]  # this host runs 300 ms ahead

    def host_clock() -> int:
        host[0] += 2  # each read takes 2 ms
        return host[0]

    sync = ClockSync(host_clock, lambda: host[0] - 300)
    sync.measure()
    assert sync.offset is not None and -302 <= sync.offset <= -298
    assert sync.error == 2 and sync.trusted  # half the 2 ms round trip + 1 ms resolution
    assert sync.lower() <= host[0] - 300  # never ahead of the reference
    far = ClockSync(lambda: T0 + 5_000, lambda: T0)
    far.measure()
    assert not far.trusted
    assert not ClockSync(lambda: T0, lambda: T0).trusted  # never measured


def test_a_step_of_the_host_wall_clock_does_not_move_the_lower_bound() -> None:
    """Between measures, elapsed time comes from the monotonic clock: an NTP step of the wall
    clock (here an hour forward) cannot make a send look due early."""
    reference, wall, mono = [T0], [T0 + 40], [5_000]
    sync = ClockSync(lambda: wall[0], lambda: reference[0], lambda: mono[0])
    sync.measure()
    assert sync.trusted and sync.lower() <= T0
    wall[0] += 3_600_000  # stepped
    mono[0] += 250
    reference[0] += 250
    assert sync.lower() <= reference[0] <= sync.now()
    sync.measure()  # the next measure sees the wall clock is broken: nothing is sent
    assert not sync.trusted


def test_callback_body_embeds_the_stored_payload_verbatim() -> None:
    text = '{"b":1,"a":[1.50,"ü"]}'  # key order and number spelling as the client sent them
    created = timers.create(
        "acme",
        "tmr_x",
        schedule=AtSchedule(T0 + 1_000),
        target_queue_url="q",
        payload_json=text,
        now_ms=T0,
    )
    timer = replace(created, rev=1, partition=7)
    body = callback_body(timer, T0 + 1_000, T0 + 1_041)
    assert body.endswith(f',"payload":{text}}}')
    assert json.loads(body) == {
        "fire_id": f"tmr_x:{T0 + 1_000}",
        "timer_id": "tmr_x",
        "tenant": "acme",
        "name": None,
        "scheduled_at": "2026-11-21T10:00:01.000Z",
        "fired_at": "2026-11-21T10:00:01.041Z",
        "payload": {"b": 1, "a": [1.5, "ü"]},
    }
