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
6. test_keys_given_with_one_prefix_have_ids_of_their_own_each_revocable - a key id was the
   key's first 10 characters: two admin-given keys shared one, and DELETE reached the first
   only; test_keys_listed_under_one_id_before_are_shown_apart_and_each_revocable - lists
   written before the fix keep working.
7. test_the_admin_cannot_give_a_tenant_an_eleventh_key - ``key add`` listed past 10;
   test_a_key_from_before_the_list_joins_it_even_past_ten_and_can_be_revoked - decided: a key
   that exists is listed on its first use, never hidden or refused; no new key past 10.
8. test_a_node_that_serves_no_bucket_after_a_failover_keeps_no_peek - the fan-out kept a
   failed-over node's peek for ever, and answered it, stale, when the name served again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
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
from tests.integration.test_engine_index import many
from tests.integration.test_trigger import (  # noqa: F401 - rig is a fixture
    Rig,
    claim_items,
    rig,
    until_armed,
)
from tests.support.clock import T0, FakeClock
from tests.support.webhook_server import Endpoint, webhook_server
from timers.config import ConfigError, Settings
from timers.core.times import format_ms, parse_ms
from timers.delivery import http_target
from timers.engine.index import BucketIndex, Peek, PeekPending
from timers.runtime import redis_time_ms
from timers_client import Client, bulk, cli
from timers_client.errors import ErrorDetail, RateLimited, ValidationError

pytestmark = pytest.mark.integration

GUARD_S = 10  # a real-time bound on waiting for another thread: never reached when it works
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
    count at its end (docs/tenants.md's words), this month the count now."""
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


# ---------------------------------------------------------------- 6, 7. key ids, the 10-key cap


def key_ids(api: Api) -> list[str]:
    reply = api.call("GET", "/v1/tenant/keys")
    assert reply.status == 200, reply.body
    return [k["key_id"] for k in reply.body["items"]]


def works(api: Api, key: str) -> bool:
    api.clock.advance(1_001)  # past any sandbox's revocation check
    return api.call("GET", "/v1/tenant", key=key).status == 200


def test_keys_given_with_one_prefix_have_ids_of_their_own_each_revocable(api: Api) -> None:
    """A key id was the key's first 10 characters: two keys an admin gave (``key add`` with a
    key, TIMERS_DEMO_API_KEY) with one prefix shared it, and DELETE reached only the first."""
    one, two = "tk_shared_prefix-one", "tk_shared_prefix-two"
    assert api.tenants.add_key("acme", api.clock(), one) == one
    assert api.tenants.add_key("acme", api.clock(), two) == two
    ids = key_ids(api)
    assert len(ids) == len(set(ids)) == 3, ids
    first, second = ids[1], ids[2]
    assert first.startswith("key_") and second.startswith("key_")  # short keys: hash pieces
    assert api.call("DELETE", f"/v1/tenant/keys/{second}").status == 204
    assert (works(api, one), works(api, two)) == (True, False)
    assert api.call("DELETE", f"/v1/tenant/keys/{first}").status == 204
    assert (works(api, one), works(api, api.keys["acme"])) == (False, True)
    assert key_ids(api) == [api.keys["acme"][:10]]


def test_a_short_keys_id_shows_none_of_the_key(api: Api) -> None:
    """A key id is shown to every key of the tenant: of an admin-given key of 10 characters
    it was the whole secret. A key shorter than SHOWN_FROM_CHARS is named by a piece of its
    hash; a generated key by its first characters."""
    short = "s3cr3t-k3y"
    assert api.tenants.add_key("acme", api.clock(), short) == short
    ids = key_ids(api)
    assert ids[0] == api.keys["acme"][:10]
    assert ids[1] == "key_" + hashlib.sha256(short.encode()).hexdigest()[:10]
    assert not any(short[:4] in key_id for key_id in ids[1:])
    assert api.call("DELETE", f"/v1/tenant/keys/{ids[1]}").status == 204
    assert not works(api, short)


def test_keys_listed_under_one_id_before_are_shown_apart_and_each_revocable(api: Api) -> None:
    """A list written before ids were kept apart may hold two keys with one id: the stored id
    still revokes the key it named first; the other shows an id of its own, which reaches it."""
    store = api.tenants
    one, two = "tk_shared_prefix-one", "tk_shared_prefix-two"
    tenant = store._get_item("acme")
    listed = json.loads(tenant.api_keys)
    for key in (one, two):  # what add_key stored and listed before: both with id "tk_shared_"
        digest = hashlib.sha256(key.encode()).hexdigest()
        store.models.api_key(f"KEY#{digest}", tenant="acme", key_id=key[:10],
                             created_ms=api.clock()).save()  # fmt: skip
        listed.append({"id": key[:10], "h": digest, "c": api.clock(), "l": None})
    tenant.update(actions=[store.models.tenant.api_keys.set(json.dumps(listed))])
    ids = key_ids(api)
    assert ids[1] == one[:10] and ids[2] != ids[1] and ids[2].startswith(one[:10]), ids
    assert api.call("DELETE", f"/v1/tenant/keys/{one[:10]}").status == 204  # as it always did
    assert (works(api, one), works(api, two)) == (False, True)
    assert key_ids(api) == [api.keys["acme"][:10], ids[2]]  # the other's id stays its own
    assert api.call("DELETE", f"/v1/tenant/keys/{ids[2]}").status == 204
    assert works(api, two) is False


def admin_says(api: Api, monkeypatch: pytest.MonkeyPatch, capsys: Any, *argv: str) -> Any:
    """``python -m ops.admin ARGV`` on the harness's tables: exit code, stdout and stderr lines."""
    target = admin.Target(admin.LOCAL_SETTINGS, boto3.client("sqs"))
    monkeypatch.setattr(admin, "local_target", lambda: target)
    code = admin.main(list(argv))
    said = capsys.readouterr()
    return code, said.out.splitlines(), said.err.splitlines()


def test_the_admin_cannot_give_a_tenant_an_eleventh_key(
    api: Api, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``key add`` (and ``tenant create --api-key`` with a new key) listed keys past the
    contract's 10: a one-line error now, exit code 1, nothing registered."""
    for _ in range(9):
        assert api.call("POST", "/v1/tenant/keys", body={}).status == 201
    assert len(key_ids(api)) == 10
    for argv in (
        ["key", "add", "acme"],
        ["tenant", "create", "acme", "--api-key", "tk_x123456789"],
    ):
        code, out, err = admin_says(api, monkeypatch, capsys, *argv)
        assert code == 1 and out == [] and len(err) == 1, (argv, out, err)
        assert err[0].startswith("ops.admin: ") and "10" in err[0], err
    assert len(key_ids(api)) == 10
    assert api.call("GET", "/v1/tenant", key="tk_x123456789").status == 401  # not registered
    code, _, err = admin_says(api, monkeypatch, capsys, "tenant", "create", "acme",
                              "--api-key", api.keys["acme"])  # fmt: skip
    assert code == 0, err  # a key it has: idempotent, nothing added
    assert len(key_ids(api)) == 10


def test_a_key_from_before_the_list_joins_it_even_past_ten_and_can_be_revoked(
    api: Api,
) -> None:
    """Decided: a key registered before tenants had a key list exists already; on its first
    use it is listed even when that makes 11 - never hidden (the tenant could not see or
    revoke it) nor refused (a working key would stop working). No new key is made while 10 or
    more are listed; the tenant revokes down to 9 first."""
    for _ in range(9):
        assert api.call("POST", "/v1/tenant/keys", body={}).status == 201
    old = "tk_from_before_the_list"
    digest = hashlib.sha256(old.encode()).hexdigest()
    api.tenants.models.api_key(f"KEY#{digest}", tenant="acme", key_id=old[:10],
                               created_ms=api.clock()).save()  # fmt: skip
    assert api.call("GET", "/v1/tenant", key=old).status == 200  # its first use lists it
    ids = key_ids(api)
    assert len(ids) == 11 and ids[-1] == old[:10]
    refused = api.call("POST", "/v1/tenant/keys", body={})
    assert (refused.status, refused.error_code) == (409, "invalid_state")
    older = "tk_older_than_the_list"  # registered again by the admin: listed, as its use would
    digest = hashlib.sha256(older.encode()).hexdigest()
    api.tenants.models.api_key(f"KEY#{digest}", tenant="acme", key_id=older[:10],
                               created_ms=api.clock()).save()  # fmt: skip
    assert api.tenants.add_key("acme", api.clock(), older) == older
    assert key_ids(api)[11:] == [older[:10]]
    for key in (old, older):
        assert api.call("DELETE", f"/v1/tenant/keys/{key[:10]}").status == 204
        assert works(api, key) is False
    assert api.call("POST", "/v1/tenant/keys", body={}).status == 409  # 10: still full


# ---------------------------------------------------------------- 8. the fan-out's shard peeks


class MovingShards:
    """A plain redis-server whose buckets the "nodes" of ``serving`` serve: a failover is a
    new name for a node's buckets (its replica, promoted), as redis-py's cluster map says."""

    def __init__(self, real: redis.Redis, serving: dict[int, str]) -> None:
        self.real, self.serving = real, serving

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def get_node_from_key(self, key: str) -> Any:
        return SimpleNamespace(name=self.serving[int(key.split("{b")[1].split("}")[0])])


def peeks_until_answered(index: BucketIndex) -> dict[int, Peek | Exception]:
    """Polls, as the fan-out's (each waits SHARD_WAIT_S for a slow shard), until every bucket
    has an answer."""
    for _ in range(50):
        got = index.peek(range(4), T0)
        if not any(isinstance(p, PeekPending) for p in got.values()):
            return got
    raise AssertionError(f"a shard never answered: {got}")


def test_a_node_that_serves_no_bucket_after_a_failover_keeps_no_peek(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard's peek slower than SHARD_WAIT_S is kept, to answer at the next poll; a node
    that failed over serves no bucket at that poll, and its peek was kept for ever (a leak in
    a long-lived fan-out) - and answered, stale, if that node's name came to serve again."""
    shards = MovingShards(redis_client, {0: "a", 1: "b", 2: "a", 3: "b"})
    index = BucketIndex(shards, bucket_count=4)  # type: ignore[arg-type]
    assert index.put([c for b in range(4) for c in many(1, T0 - b, tenant=f"t{b}", partition=b)])
    gate = threading.Event()
    peek = index._peek

    def slow_b(buckets: Sequence[int], until: int) -> Any:
        if shards.serving[buckets[0]] == "b" and not gate.is_set():
            gate.wait(GUARD_S)  # node b hangs: the failover is under way
        return peek(buckets, until)

    monkeypatch.setattr(index, "_peek", slow_b)
    got = index.peek(range(4), T0)
    assert {b for b, p in got.items() if isinstance(p, PeekPending)} == {1, 3}
    shards.serving = {0: "a", 1: "c", 2: "a", 3: "c"}  # b's replica, c, serves its buckets
    gate.set()
    index._shard_peeks["b"].result(GUARD_S)  # b's peek ends, after its poll
    assert index.put(many(1, T0 - 100, tenant="later", partition=1))  # bucket 1 moves on
    fresh = {1: Peek(T0 - 100, 2, None, None, None), 3: Peek(T0 - 3, 1, None, None, None)}
    got = peeks_until_answered(index)
    assert {b: got[b] for b in (1, 3)} == fresh
    assert set(index._shard_peeks) <= {"a", "c"}  # was: b's peek, kept for ever
    shards.serving = {0: "a", 1: "b", 2: "a", 3: "b"}  # another failover: b serves again
    got = peeks_until_answered(index)
    assert {b: got[b] for b in (1, 3)} == fresh  # was: b's answer from before, stale
