# ruff: noqa: RUF001, RUF002 - the digits of other scripts are what these tests are about
"""Review 36: its confirmed defects and its suspicions, each decided by a test.

1. Numbers in other scripts' digits (``int()``, ``isdigit`` and ``\\d`` take ``２``, ``٢``, ``²``):
   - test_a_month_in_other_digits_is_400_on_month - ``GET /v1/tenant/usage?month=`` answered
     200 with zeros;
   - test_a_fire_history_cursor_in_other_digits_is_400_on_cursor - a cursor is base64 JSON a
     client can write: its positions were read by ``int()``;
   - test_a_fire_id_in_other_digits_is_404_never_500 - ``redeliver`` of ``<timer>:²`` was a
     500 (``isdigit`` yes, ``int()`` no);
   - test_a_webhook_answer_with_a_retry_after_in_other_digits_keeps_its_status - a 503 (or a
     2xx) whose ``Retry-After: ²`` was read as a connection error, its status lost;
   - test_the_environment_is_read_in_ascii_digits - the functions' settings, the local
     stack's ports, the admin's numbers;
   - test_the_cli_reads_numbers_in_ascii_digits_only - ``--in ３s``, ``--every``, ``--limit``,
     ``--count``, ``--max-fires``, ``--retry-*``, ``--idle``, a whole fire id;
   - test_the_sdk_reads_numbers_in_ascii_digits - a 429's ``Retry-After`` (``٣``, ``1e9``,
     ``inf``), the lines an import's 400 names;
   - test_other_digits_are_refused_where_the_parsers_already_refuse_them - RFC 3339 times,
     ``limit``, cron fields, a webhook URL's port and JSON numbers already refuse them: 400 on
     the field, nothing created.
2. test_the_documented_active_timers_is_what_an_earlier_month_answers - ``UsageOut``'s text
   said "the same for any month asked"; an earlier month answers its end's count.
3. test_changes_fencing_one_position_again_count_no_entry_and_fill_no_item - a fence over a
   fence added 1 to its claim item's count: edits of one timer filled the item, and other
   timers' fires of that partition and second paid a seal and a child item.
4. test_run_now_without_its_reference_clock_is_503_and_writes_nothing - Redis unreachable
   (its TIME is run now's clock) was a 500; an untrusted clock a 409.
5. test_run_now_whose_record_answer_was_lost_answers_the_fire_it_sent - the record after the
   send can fail its condition (its answer lost, botocore's retry meeting its own write): a 409
   for a fire on the queue, and a retry sent a second one.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ops import admin
from ops.local.stack import LocalConfig, StackError
from ops.ports import free_port
from tests.integration.api_harness import Api, make_api
from tests.integration.test_cli import HandlerTransport, timers
from tests.integration.test_trigger import (  # noqa: F401 - rig is a fixture
    Rig,
    claim_items,
    rig,
    until_armed,
)
from tests.support.clock import T0, FakeClock
from tests.support.webhook_server import Endpoint, webhook_server
from timers.adapters import http_target
from timers.config import ConfigError, Settings
from timers.core.times import format_ms, parse_ms
from timers.runtime import redis_time_ms
from timers_client import Client, bulk, cli
from timers_client.errors import ErrorDetail, RateLimited, ValidationError

pytestmark = pytest.mark.integration

OTHER_DIGITS = ("２０２６-１１", "٢٠٢٦-١١", "2026-１１", "２０２６-11", "۲۰۲۶-۱۱")


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    yield make_api(monkeypatch, clock, redis_url)


@pytest.fixture
def cli_api(api: Api, monkeypatch: pytest.MonkeyPatch) -> Api:
    """``timers`` (the CLI) on the api handler, as tests/integration/test_cli.py runs it."""
    transport = HandlerTransport(api)
    monkeypatch.setattr(cli, "Client", lambda url, key: Client(url, key, transport=transport))
    return api


def assert_400_on(reply: Any, field: str) -> None:
    assert (reply.status, reply.error_code) == (400, "validation_error"), reply.body
    assert reply.error_fields == {field}, reply.body
    assert field in reply.body["error"]["message"]


# ---------------------------------------------------------------- 1. ASCII digits only


def test_a_month_in_other_digits_is_400_on_month(api: Api) -> None:
    assert api.call("GET", "/v1/tenant/usage", query={"month": "2026-11"}).status == 200
    for month in OTHER_DIGITS:
        assert_400_on(api.call("GET", "/v1/tenant/usage", query={"month": month}), "month")


def test_a_fire_history_cursor_in_other_digits_is_400_on_cursor(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60})
    path = f"/v1/timers/{timer['id']}/fires"

    def cursor(position: str) -> str:  # what encode_cursor writes, by hand: nothing signs it
        raw = json.dumps({"t": "acme", "s": f"fires:{timer['id']}", "p": position})
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    assert api.call("GET", path, query={"cursor": cursor("1795255200000|")}).status == 200
    for position in ("١٧٩٥٢٥٥٢٠٠٠٠٠|", "|１７９５２５５２０００００", "1_795_255_200_000|", " 1|"):
        assert_400_on(api.call("GET", path, query={"cursor": cursor(position)}), "cursor")


def test_a_fire_id_in_other_digits_is_404_never_500(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60})
    for due in ("²", "¹²", "١٧٩٥٢٥٥٢٦٠٠٠٠", "１７９５２５５２６００００"):
        fire_id = httpx.URL(f"http://x/{timer['id']}:{due}").raw_path.decode()[1:]
        reply = api.call("POST", f"/v1/timers/{timer['id']}/fires/{fire_id}/redeliver")
        assert (reply.status, reply.error_code) == (404, "not_found"), (due, reply.body)


def test_a_webhook_answer_with_a_retry_after_in_other_digits_keeps_its_status() -> None:
    """http.client reads header values as Latin-1, where ``¹²³`` are digits to ``isdigit``."""
    with webhook_server() as server:
        for path, status, given in (("/a", 503, "²"), ("/b", 200, "¹"), ("/c", 429, "3")):
            server.endpoints[path] = Endpoint([status], headers={"Retry-After": given})
            attempt = http_target.post(server.url(path), b"{}", {}, allow_loopback=True)
            assert (attempt.status, attempt.error) == (status, None), (given, attempt)
            assert attempt.retry_after_s == (3 if given == "3" else None)


def test_the_environment_is_read_in_ascii_digits() -> None:
    assert Settings.from_env({"BUCKET_COUNT": "16"}).bucket_count == 16
    for raw in ("１６", "١٦", "²", "--16"):
        with pytest.raises(ConfigError, match="BUCKET_COUNT"):
            Settings.from_env({"BUCKET_COUNT": raw})
    assert LocalConfig.from_env({"API_PORT": "3000"}).api_port == 3000
    for name, raw in (("API_PORT", "３０００"), ("REDIS_SHARDS", "３"), ("API_PORT", "³")):
        with pytest.raises(StackError, match=name):
            LocalConfig.from_env({name: raw})
    parser = admin._parser()
    assert parser.parse_args(["tenant", "spread", "acme", "8"]).buckets == 8
    for argv in (["tenant", "spread", "acme", "８"], ["tenant", "rate", "acme", "٥٠"],
                 ["webhook", "rotate", "acme", "--window-hours", "２"]):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(argv)
        assert exited.value.code == 2, argv


def test_the_cli_reads_numbers_in_ascii_digits_only(
    cli_api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    api = cli_api
    code, out, err = timers(api, capsys, "--json", "create", "--in", "3s")
    assert code == 0, err
    timer_id = json.loads(out)["id"]
    refused = [
        ["create", "--in", "３s"],
        ["create", "--in", "٣"],
        ["create", "--every", "５m"],
        ["create", "--in", "1e3"],
        ["create", "--in", "inf"],
        ["create", "--in", "3s", "--max-fires", "３"],
        ["create", "--in", "3s", "--url", "https://example.com/h", "--retry-attempts", "٣"],
        ["create", "--in", "3s", "--url", "https://example.com/h", "--retry-max-age", "１０m"],
        ["ls", "--limit", "５"],
        ["fires", timer_id, "--limit", "²"],
        ["failed", "--limit", "５"],
        ["preview", "--every", "90s", "--count", "５"],
        ["tail", "--count", "１"],
        ["tail", "--idle", "３s"],
    ]
    for argv in refused:
        code, _, err = timers(api, capsys, *argv)
        assert code == 2, (argv, err)
    # a whole fire id is ``<timer>:<13+ ASCII digits>``; anything else is the start of one
    whole = f"{timer_id}:１７９５２５５２６００００"
    code, _, err = timers(api, capsys, "redeliver", timer_id, whole)
    assert code == 2 and "no failed fire" in err, err
    assert len(api.call("GET", "/v1/timers").body["items"]) == 1  # nothing else was created


def test_the_sdk_reads_numbers_in_ascii_digits() -> None:
    """A 429's ``Retry-After`` (``float()`` took ``٣``, ``1e9``, ``inf``), and the lines an
    import's 400 names (``timers[3].name``)."""
    for given, want in (("2", 2.0), ("٣".encode(), 0.5), ("1e9", 0.5), ("inf", 0.5)):
        sleeps: list[float] = []

        def handler(_: httpx.Request, given: Any = given) -> httpx.Response:
            body = {"error": {"code": "rate_limited", "message": "slow down", "details": []}}
            return httpx.Response(429, json=body, headers={"Retry-After": given})

        sdk = Client("http://api.example.com/v1", "tk_x", transport=httpx.MockTransport(handler),
                     max_retries=1, sleep=sleeps.append)  # fmt: skip
        with pytest.raises(RateLimited):
            sdk.get("tmr_1")
        assert sleeps == [want], given
    batch = [bulk.Line(n + 1, {}, None, False) for n in range(5)]
    details = [ErrorDetail("timers[3].name", "too long"), ErrorDetail("timers[１].name", "x")]
    refused = bulk.refused_lines(ValidationError(400, "validation_error", "bad", details), batch)
    assert refused == {3: "name: too long"}


def test_other_digits_are_refused_where_the_parsers_already_refuse_them(api: Api) -> None:
    """Python's datetime.fromisoformat, pydantic's integers, the cron check's ``[0-9]`` and
    http.client's port refuse them already: a 400 on the field, and nothing created."""
    at = {"type": "at", "at": "２０２６-11-21T10:00:00Z"}
    assert_400_on(api.call("POST", "/v1/timers", body={"schedule": at}), "schedule.at")
    later = {"type": "after", "seconds": 60}
    body = {"schedule": later, "start_at": "2026-11-21T10:00:00+０１:00"}
    assert_400_on(api.call("POST", "/v1/timers", body=body), "start_at")
    cron = {"type": "cron", "expression": "０ ７ * * *"}
    assert_400_on(api.call("POST", "/v1/timers", body={"schedule": cron}), "schedule.expression")
    cron = {"type": "cron", "expression": "0 7 * * 1-٥"}
    assert_400_on(api.call("POST", "/v1/timers", body={"schedule": cron}), "schedule.expression")
    target = {"url": "https://example.com:８４４３/hook"}
    body = {"schedule": later, "target": target}
    assert_400_on(api.call("POST", "/v1/timers", body=body), "target.url")
    raw = '{"schedule": {"type": "after", "seconds": ٣}}'
    assert api.call("POST", "/v1/timers", raw_body=raw).status == 400
    assert_400_on(api.call("GET", "/v1/timers", query={"limit": "１０"}), "limit")
    assert_400_on(
        api.call("GET", "/v1/fires", query={"status": "failed", "since": "٢٠٢٦-11-21T10:00:00Z"}),
        "since",
    )
    preview = {"schedule": {"type": "every", "seconds": 60}, "count": "５"}
    assert_400_on(api.call("POST", "/v1/schedule-preview", body=preview), "count")
    assert api.call("GET", "/v1/timers").body["items"] == []


# ---------------------------------------------------------------- 2. active_timers, documented


def test_the_documented_active_timers_is_what_an_earlier_month_answers(api: Api) -> None:
    """The OpenAPI text said "the same for any month asked"; an earlier month answers the
    count at its end (the README's words), this month the count now."""
    doc = api.call("GET", "/v1/openapi.json", tenant=None).body
    said = doc["components"]["schemas"]["UsageOut"]["properties"]["active_timers"]["description"]
    assert "same for any month" not in said
    assert "at the end of the month" in said and "this month" in said, said
    first = api.create(schedule={"type": "every", "seconds": 60})
    api.create(schedule={"type": "every", "seconds": 60})
    api.clock.now = parse_ms("2026-12-02T09:00:00Z")
    assert api.call("POST", f"/v1/timers/{first['id']}/pause").status == 200

    def active(month: str | None) -> int:
        reply = api.call("GET", "/v1/tenant/usage", query={"month": month} if month else None)
        assert reply.status == 200, reply.body
        return int(reply.body["active_timers"])

    assert (active("2026-11"), active("2026-12"), active(None)) == (2, 1, 1)
    assert active("2026-10") == 0  # before the tenant's first timer


# ---------------------------------------------------------------- 3. a fence again counts nothing


def test_changes_fencing_one_position_again_count_no_entry_and_fill_no_item(
    rig: Rig,  # noqa: F811
) -> None:
    """Every change fences its timer's cursor; a fence over a fence rewrote the entry and
    still added 1 to the item's count. About CLAIM_CAP edits of a timer whose next fire stays
    in one second made the item read as full: every other fire of that partition and second
    then paid a seal and a child item."""
    api = rig.api
    api.tenants.set_spread("acme", 1)  # every timer in one claim partition
    rig.log.cap = 8
    due = T0 + 2_000
    edited = api.create(schedule={"type": "at", "at": format_ms(due)})
    for n in range(3 * rig.log.cap):
        reply = api.call("PATCH", f"/v1/timers/{edited['id']}", body={"name": f"edit {n}"})
        assert reply.status == 200, reply.body
    root = f"{rig.stored(edited['id']).partition}/{due // 1000}"

    def counted() -> tuple[int, int]:
        item = claim_items(rig)[root]
        return int(item["c"]["N"]), len([name for name in item if "@" in name])

    assert counted() == (1, 1)  # one fence, counted once
    other = api.create(schedule={"type": "at", "at": format_ms(due)})
    until_armed(rig, due)
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{edited['id']}:{due}": 1, f"{other['id']}:{due}": 1})
    items = claim_items(rig)
    assert "sl" not in items[root] and not [k for k in items if k.startswith(root + "/")]
    assert counted() == (2, 2)


# ---------------------------------------------------------------- 4. run now, Redis unreachable


def written_for(api: Api, timer_id: str) -> list[str]:
    """The claims table's entries and extra-fire listings of a timer."""
    items = boto3.client("dynamodb").scan(TableName=api.runtime.wiring.log.table)["Items"]
    return [
        f"{item['k']['S']} {name}"
        for item in items
        for name in item
        if name.startswith(f"{timer_id}@") or item["k"]["S"].endswith(f"/{timer_id}")
    ]


def queued(api: Api, tenant: str = "acme") -> list[Any]:
    sqs = boto3.client("sqs")
    return list(sqs.receive_message(QueueUrl=api.queues[tenant]).get("Messages", []))


def test_run_now_without_its_reference_clock_is_503_and_writes_nothing(api: Api) -> None:
    """Run now fires by the reference clock (Redis TIME, the trigger's): unreachable, it was
    an unhandled error - a 500. The api fails open where Redis is an index or a limiter (the
    fast path, the rate limit); run now cannot fire without it: 503 ``unavailable``, with
    Retry-After, nothing claimed, listed or sent - as when the clock is there but cannot be
    trusted (it was a 409 concurrent_update)."""
    timer = api.create(schedule={"type": "every", "seconds": 60})
    extras = api.runtime.service.extras
    assert extras is not None
    dead = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))  # nothing listens there
    for reference in (lambda: redis_time_ms(dead), lambda: api.clock() + 5_000):
        extras.reference = reference  # the second: 5 s off this host's clock, not trusted
        reply = api.call("POST", f"/v1/timers/{timer['id']}/run")
        assert (reply.status, reply.error_code) == (503, "unavailable"), reply.body
        assert reply.body["error"]["details"] == [] and reply.body["error"]["message"]
        assert reply.headers["retry-after"] == "1"
        assert written_for(api, timer["id"]) == []
        assert queued(api) == []
    doc = api.call("GET", "/v1/openapi.json", tenant=None).body
    answers = doc["paths"]["/v1/timers/{timer_id}/run"]["post"]["responses"]
    assert "unavailable" in answers["503"]["description"]
    assert "Retry-After" in answers["503"]["headers"]
    extras.reference = api.clock
    assert api.call("POST", f"/v1/timers/{timer['id']}/run").status == 202  # and once it is back


# ---------------------------------------------------------------- 5. run now, record after send


class LostAnswer:
    """A DynamoDB client whose first UpdateItem is applied and its answer lost: botocore
    sends it again (a read timeout, a 500 after the write), and the caller sees the second
    attempt's answer - a condition that no longer holds, since the first one was applied."""

    def __init__(self, real: Any) -> None:
        self.real, self.lost = real, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def update_item(self, **request: Any) -> Any:
        if not self.lost:
            self.lost += 1
            self.real.update_item(**request)
        return self.real.update_item(**request)


def test_run_now_whose_record_answer_was_lost_answers_the_fire_it_sent(api: Api) -> None:
    """The record after the send can come back False: its answer lost and botocore's retry
    meeting the write it made. Run now answered 409 ("the claim was taken meanwhile") for a
    fire on the queue, and the user's retry sent a second one. It reads what it recorded: 202,
    the fire as sent, once on the queue, in the history and in usage."""
    timer = api.create(schedule={"type": "every", "seconds": 60})
    api.clock.advance(10_000)
    log = api.runtime.wiring.log
    log._record_client = lost = LostAnswer(log.client)
    reply = api.call("POST", f"/v1/timers/{timer['id']}/run")
    assert lost.lost == 1  # the record's answer was lost
    assert reply.status == 202, reply.body
    fire = reply.body
    assert fire["status"] == "enqueued" and fire["enqueued_at"] is not None
    assert [json.loads(m["Body"])["fire_id"] for m in queued(api)] == [fire["fire_id"]]
    shown = api.call("GET", f"/v1/timers/{timer['id']}/fires").body["items"]
    assert shown == [fire]
    assert api.call("GET", "/v1/tenant/usage").body["fires"]["enqueued"] == 1
