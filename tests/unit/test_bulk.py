"""``timers import``/``export``'s pieces (timers_client.bulk) against a fake batch endpoint that
answers as the service does: all or nothing, invalid timers named ``timers[i].field``. Over HTTP
against the local stack: tests/e2e/test_sdk_and_cli.py."""

from __future__ import annotations

import json
from typing import Any

from timers_client import Timer
from timers_client.bulk import (
    BATCH,
    ImportReport,
    Line,
    batches,
    export_line,
    idempotency_key,
    import_batch,
    parse_lines,
)
from timers_client.errors import ErrorDetail, ValidationError

QUEUE = "https://sqs.example/acme"


def timer(n: int, **fields: Any) -> Timer:
    data = {
        "id": f"tmr_{n}",
        "name": f"n{n}",
        "schedule": {"type": "every", "seconds": 60.0},
        "start_at": None,
        "end_at": None,
        "max_fires": None,
        "target": {"queue_url": QUEUE},
        "payload": None,
        "misfire": "fire_once",
        "status": "active",
        "next_fire_at": "2099-01-01T00:00:00.000Z",
        "fire_count": 0,
        "created_at": "2098-12-31T23:59:00.000Z",
        "updated_at": "2098-12-31T23:59:00.000Z",
    }
    return Timer.from_json({**data, **fields})  # fmt: skip


class BatchEndpoint:
    """Refuses the bodies holding ``"bad"`` (all or nothing), creates the rest."""

    def __init__(self) -> None:
        self.requests: list[tuple[list[dict[str, Any]], str]] = []
        self.paused: list[str] = []
        self.made = 0

    def create(self, bodies: list[dict[str, Any]], key: str) -> list[Timer]:
        self.requests.append((bodies, key))
        bad = [ErrorDetail(f"timers[{i}].bad", "no thanks") for i, b in enumerate(bodies)
               if "bad" in b]  # fmt: skip
        if bad:
            raise ValidationError(400, "validation_error", "some timers are invalid", bad)
        self.made += len(bodies)
        return [timer(self.made - len(bodies) + i) for i in range(len(bodies))]

    def pause(self, timer_id: str) -> Timer:
        self.paused.append(timer_id)
        return timer(0, id=timer_id, status="paused")


def lines(*bodies: dict[str, Any]) -> list[Line]:
    return [Line(i + 1, body, None, False) for i, body in enumerate(bodies)]


def test_an_export_line_is_a_create_body_that_imports_anywhere() -> None:
    line = json.loads(export_line(timer(1, payload={"a": "β"}, status="paused"), QUEUE))
    assert line == {"id": "tmr_1", "name": "n1", "schedule": {"type": "every", "seconds": 60.0},
                    "misfire": "fire_once", "payload": {"a": "β"}, "status": "paused",
                    "fire_count": 0}  # fmt: skip
    one_shot = timer(2, schedule={"type": "after", "seconds": 30.0},
                     target={"url": "https://hooks.example/x", "headers": {}})  # fmt: skip
    line = json.loads(export_line(one_shot, QUEUE))
    assert line["schedule"] == {"type": "at", "at": "2099-01-01T00:00:00.000Z"}  # not relative
    assert line["target"] == {"url": "https://hooks.example/x", "headers": {}}
    assert (line["status"], line["fire_count"]) == ("active", 0)
    windowed = json.loads(export_line(timer(3, window_seconds=60), QUEUE))
    assert windowed["window_seconds"] == 60  # carried; the default 0 is left implicit


def test_an_import_never_fires_again_what_fired() -> None:
    """Completed timers are skipped; a recurring one keeps only the fires it has left."""
    report = ImportReport()
    done = timer(1, status="completed", fire_count=1, next_fire_at=None,
                 schedule={"type": "after", "seconds": 1.0})  # fmt: skip
    capped = timer(2, status="completed", fire_count=3, max_fires=3, next_fire_at=None)
    halfway = timer(3, fire_count=2, max_fires=5)
    paused = timer(4, status="paused", fire_count=4, max_fires=5)
    endless = timer(5, fire_count=7)
    text = [export_line(t, QUEUE) for t in (done, capped, halfway, paused, endless)]
    text.append('{"schedule": {"type": "at", "at": "2099-01-01T00:00:00Z"}, "fire_count": 1}')
    parsed = list(parse_lines(text, report))
    assert report.skipped == [(1, "tmr_1"), (2, "tmr_2"), (6, None)]  # a one-shot that fired
    assert [(p.was, p.body.get("max_fires"), p.paused) for p in parsed] == [
        ("tmr_3", 3, False), ("tmr_4", 1, True), ("tmr_5", None, False),
    ]  # fmt: skip
    assert not any("fire_count" in p.body or "status" in p.body for p in parsed)
    assert len(report.skipped) + len(parsed) == 6 and report.failed == []
    bad = list(parse_lines(['{"schedule": {"type": "every", "seconds": 5}, "fire_count": -1}'],
                           report))  # fmt: skip
    assert bad == [] and report.failed == [(1, "fire_count: -1 is not a count of fires")]


def test_lines_that_are_not_json_objects_are_reported_with_their_number() -> None:
    report = ImportReport()
    text = [
        '{"schedule": {"type": "every", "seconds": 5}, "id": "tmr_old", "status": "paused"}',
        "", "[1]", "{oops", '{"schedule": {}, "status": "frozen"}', '{"name": "x"}',
    ]  # fmt: skip
    parsed = list(parse_lines(text, report))
    assert [(p.number, p.was, p.paused) for p in parsed] == [(1, "tmr_old", True), (6, None, False)]
    assert parsed[0].body == {"schedule": {"type": "every", "seconds": 5}}  # id, status: ours
    assert [n for n, _ in report.failed] == [3, 4, 5]
    assert "not a JSON object" in report.failed[0][1] and "not JSON" in report.failed[1][1]


def test_batches_hold_at_most_what_the_endpoint_takes() -> None:
    sizes = [len(b) for b in batches(lines(*({"n": i} for i in range(2 * BATCH + 1))))]
    assert sizes == [BATCH, BATCH, 1]


def test_the_lines_a_batch_refuses_are_reported_and_the_rest_created() -> None:
    endpoint, report = BatchEndpoint(), ImportReport()
    batch = lines({"n": 1}, {"bad": 1}, {"n": 3}, {"bad": 2})
    batch[2] = Line(3, {"n": 3}, "tmr_was", True)
    import_batch(batch, endpoint.create, endpoint.pause, report)
    assert report.failed == [(2, "bad: no thanks"), (4, "bad: no thanks")]
    assert [(line.number, t.id) for line, t in report.created] == [(1, "tmr_0"), (3, "tmr_1")]
    assert endpoint.paused == ["tmr_1"]
    first, second = endpoint.requests
    assert len(first[0]) == 4 and second[0] == [{"n": 1}, {"n": 3}]
    assert first[1] != second[1]  # another body, another idempotency key


def test_a_batch_refused_as_a_whole_fails_each_of_its_lines() -> None:
    report = ImportReport()

    def refuse(bodies: list[dict[str, Any]], key: str) -> list[Timer]:
        raise ValidationError(413, "payload_too_large", "request body is over 262144 bytes")

    import_batch(lines({"n": 1}, {"n": 2}), refuse, lambda _: None, report)
    assert [n for n, _ in report.failed] == [1, 2]
    assert "payload_too_large" in report.failed[0][1] and not report.created


def test_the_same_batch_has_the_same_idempotency_key() -> None:
    assert idempotency_key(lines({"a": 1, "b": 2})) == idempotency_key(lines({"b": 2, "a": 1}))
    assert idempotency_key(lines({"a": 1})) != idempotency_key(lines({"a": 2}))
