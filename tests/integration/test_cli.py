"""The ``timers`` command as a user types it, on the real api handler (tests/integration/
api_harness.py): the CLI's own code, the SDK and the API, with only the HTTP hop replaced by a
transport that hands each request to the handler as API Gateway would. Against the running
local stack, with the installed console script: tests/e2e/test_sdk_and_cli.py."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.api_harness import Api, make_api, seed_failed_fire
from tests.support.clock import T0, FakeClock
from timers.core.times import format_ms
from timers.core.webhook_attempts import DeliveryState
from timers_client import Client, cli

TIMERS = Path(sys.executable).parent / "timers"  # the console script


class HandlerTransport(httpx.BaseTransport):
    """httpx -> the api handler (a payload format 2.0 event) -> httpx."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-type"}
        reply = self.api.call(
            request.method,
            request.url.path,
            tenant=None,
            raw_body=request.content or None,
            headers=headers,
            query=request.url.query.decode(),
            content_type=request.headers.get("content-type"),
        )
        content = b"" if reply.body is None else json.dumps(reply.body).encode()
        return httpx.Response(reply.status, headers=reply.headers, content=content)


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    made = make_api(monkeypatch, clock, redis_url)
    transport = HandlerTransport(made)
    monkeypatch.setattr(cli, "Client", lambda url, key: Client(url, key, transport=transport))
    yield made


def timers(
    api: Api, capsys: pytest.CaptureFixture[str], *argv: str, stdin: str | None = None
) -> tuple[int, str, str]:
    """``timers ARGV`` as acme: exit code, stdout, stderr (a usage error exits too)."""
    os.environ.pop("TIMERS_API", None)
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        code = cli.main(["--api", "http://api.example.com/v1", "--api-key", api.keys["acme"],
                         *argv])  # fmt: skip
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    finally:
        sys.stdin = sys.__stdin__
    out, err = capsys.readouterr()
    return code, out, err


def as_json(run: tuple[int, str, str]) -> Any:
    code, out, err = run
    assert code == 0, err
    return json.loads(out)


def test_global_options_go_after_the_command_too(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    made = api.create(schedule={"type": "every", "seconds": 60}, name="n")
    listed = as_json(timers(api, capsys, "ls", "--json"))  # as docs/cli-and-sdk.md writes it
    assert [t["id"] for t in listed["items"]] == [made["id"]]
    assert as_json(timers(api, capsys, "get", made["id"], "--json"))["name"] == "n"
    code, out, err = cli_with_options_after(api, capsys, made["id"])
    assert (code, json.loads(out)["id"]) == (0, made["id"]), err


def cli_with_options_after(
    api: Api, capsys: pytest.CaptureFixture[str], timer_id: str
) -> tuple[int, str, str]:
    code = cli.main(["get", timer_id, "--api", "http://api.example.com/v1",
                     "--api-key", api.keys["acme"], "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    return code, out, err


def test_tables_print_fire_ids_whole_and_redeliver_takes_a_unique_start(
    api: Api, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    made = api.create(
        schedule={"type": "every", "seconds": 60},
        name="a long enough name to be cut in a table somewhere",
        target={"url": "https://hooks.example.com/h"},
    )
    first, second = f"{made['id']}:{T0 + 60_000}", f"{made['id']}:{T0 + 120_000}"
    seed_failed_fire(api, made["id"], first)
    seed_failed_fire(api, made["id"], second)
    clock.now = T0 + 180_000
    code, out, _ = timers(api, capsys, "failed")
    assert code == 0
    assert {line.split()[1] for line in out.splitlines()[1:]} == {first, second}  # whole
    code, out, _ = timers(api, capsys, "fires", made["id"])
    shown = {line.split()[0] for line in out.splitlines()[1:] if not line.startswith(" ")}
    assert shown and shown <= {first, second}

    code, _, err = timers(api, capsys, "redeliver", made["id"], f"{made['id']}:")
    assert code == 2 and "is the start of 2 failed fires" in err
    code, _, err = timers(api, capsys, "redeliver", made["id"], f"{made['id']}:9")
    assert code == 2 and "no failed fire" in err
    code, out, err = timers(api, capsys, "redeliver", made["id"], second[:-4])  # its own start
    assert (code, out) == (0, f"redelivered {second}\n"), err


def test_a_redelivered_fire_leaves_the_failed_list_unless_all(
    api: Api, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    made = api.create(schedule={"type": "every", "seconds": 60},
                      target={"url": "https://hooks.example.com/h"})  # fmt: skip
    fire_id = f"{made['id']}:{T0 + 60_000}"
    seed_failed_fire(api, made["id"], fire_id)
    assert timers(api, capsys, "redeliver", made["id"], fire_id)[0] == 0
    code, out, _ = timers(api, capsys, "failed")
    assert (code, out.splitlines()[1:]) == (0, [])
    code, out, _ = timers(api, capsys, "failed", "--all")
    header, row = out.splitlines()
    assert header.split()[-3:] == ["REDELIVERED", "AT", "REASON"] and row.split()[1] == fire_id
    assert row.endswith("  http 400")


GAVE_UP = "gave up after 5 attempts (max_attempts): http 503"  # 49 characters: was cut at 40


def test_fires_and_failed_print_reasons_attempts_and_the_last_answer_whole(
    api: Api, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    made = api.create(schedule={"type": "every", "seconds": 60},
                      target={"url": "https://hooks.example.com/h"})  # fmt: skip
    due = T0 + 60_000
    fire_id = f"{made['id']}:{due}"
    body = "upstream is down for maintenance until 10:30 UTC\nretry later"
    seed_failed_fire(api, made["id"], fire_id, DeliveryState(
        5, due, due + 90_000, 503, last_body=body, last_latency_ms=41, failed=GAVE_UP,
        failed_ms=due + 90_005,
    ))  # fmt: skip
    clock.now = T0 + 180_000
    code, out, err = timers(api, capsys, "fires", made["id"])
    assert code == 0, err
    header, *rest = out.splitlines()
    assert header.split() == ["FIRE", "ID", "SCHEDULED", "ENQUEUED", "DELIVERED", "LAG", "MS",
                              "STATUS", "ATTEMPTS", "LAST", "STATUS"]  # fmt: skip
    row = next(line for line in rest if line.startswith(fire_id))
    assert row.split()[-3:] == ["failed", "5", "503"]
    at = rest.index(row)
    assert rest[at + 1 : at + 3] == [
        f"    reason: {GAVE_UP}",
        f"    last error: http 503 after 41 ms, body {json.dumps(body)}",
    ]
    code, out, err = timers(api, capsys, "failed")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["FAILED", "AT", "FIRE", "ID", "ATTEMPTS", "LAST", "STATUS",
                              "REASON"]  # fmt: skip
    assert row.split()[1:4] == [fire_id, "5", "503"] and row.endswith(f"  {GAVE_UP}")


def test_tz_without_cron_is_a_usage_error(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["create", "--every", "5s", "--tz", "Europe/Berlin"],
                 ["preview", "--in", "5s", "--tz", "Europe/Berlin"]):  # fmt: skip
        code, _, err = timers(api, capsys, *argv)
        assert code == 2 and "--tz is the time zone of a --cron schedule" in err
    assert api.call("GET", "/v1/timers").body["items"] == []  # nothing created


def test_cron_times_show_in_the_schedules_time_zone_too(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    made = as_json(timers(api, capsys, "--json", "create", "--cron", "0 7 * * 1-5", "--tz",
                          "Europe/Berlin", "--name", "standup"))  # fmt: skip
    assert made["next_fire_at"] == "2026-11-23T06:00:00.000Z"  # Monday, 07:00 CET
    _, out, _ = timers(api, capsys, "ls")
    assert "2026-11-23T06:00:00.000Z (Mon 07:00 CET)" in out
    _, out, _ = timers(api, capsys, "get", made["id"])
    assert "2026-11-23T06:00:00.000Z (2026-11-23 07:00 CET)" in out
    _, out, _ = timers(api, capsys, "preview", "--cron", "0 7 * * *", "--tz",
                          "America/New_York", "--count", "1")  # fmt: skip
    assert out.strip() == "2026-11-21T12:00:00.000Z (2026-11-21 07:00 EST)"


def test_a_paused_timer_shows_no_next_fire(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    made = api.create(schedule={"type": "every", "seconds": 60})
    _, out, _ = timers(api, capsys, "pause", made["id"])
    assert "- (paused)" in out and format_ms(T0 + 60_000) not in out
    _, out, _ = timers(api, capsys, "ls")
    assert "- (paused)" in out and format_ms(T0 + 60_000) not in out


def test_reset_restarts_a_timer_and_says_why_it_cannot(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    made = api.create(schedule={"type": "every", "seconds": 60})
    timers(api, capsys, "pause", made["id"])
    api.clock.advance(90_000)
    reset = as_json(timers(api, capsys, "--json", "reset", made["id"]))
    assert (reset["status"], reset["fire_count"]) == ("active", 0)
    assert reset["next_fire_at"] == format_ms(T0 + 150_000)
    _, out, _ = timers(api, capsys, "reset", made["id"])
    assert format_ms(T0 + 150_000) in out  # the table: restarted from now, again
    passed = api.create(schedule={"type": "at", "at": format_ms(T0 + 60_000)})  # past
    code, _, err = timers(api, capsys, "reset", passed["id"])
    assert code == 1 and "schedule.at" in err


def test_run_fires_a_timer_once_now_and_says_so(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    made = api.create(schedule={"type": "every", "seconds": 60})
    api.clock.advance(5_000)
    fire = as_json(timers(api, capsys, "--json", "run", made["id"]))
    assert (fire["fire_id"], fire["status"]) == (f"{made['id']}:{T0 + 4_999}", "enqueued")
    _, out, _ = timers(api, capsys, "run", made["id"])
    assert out.startswith(f"fired {made['id']}:") and "enqueued" in out
    code, _, err = timers(api, capsys, "run", "tmr_nope")
    assert code == 1 and "tmr_nope" in err


def test_create_takes_a_retry_policy(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    made = as_json(timers(api, capsys, "--json", "create", "--in", "30s", "--url",
                          "https://example.com/h", "--retry-attempts", "3",
                          "--retry-max-age", "10m"))  # fmt: skip
    assert made["retry"] == {"max_attempts": 3, "max_age_seconds": 600}
    code, _, err = timers(api, capsys, "create", "--in", "30s", "--retry-attempts", "0")
    assert code == 1 and "retry.max_attempts" in err
    code, _, err = timers(api, capsys, "create", "--in", "30s", "--retry-max-age", "1.5s")
    assert code == 2 and "whole seconds" in err


def test_keys_are_listed_created_and_revoked(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    made = as_json(timers(api, capsys, "--json", "keys", "create", "--label", "ci"))
    assert made["api_key"].startswith("tk_") and made["label"] == "ci"
    listed = as_json(timers(api, capsys, "keys", "ls", "--json"))["items"]
    assert [k["key_id"] for k in listed] == [api.keys["acme"][:10], made["key_id"]]
    _, out, _ = timers(api, capsys, "keys", "create")
    assert out.splitlines()[0].startswith("tk_") and "shown this once" in out
    code, out, _ = timers(api, capsys, "keys", "revoke", made["key_id"])
    assert code == 0 and f"revoked {made['key_id']}" in out
    code, _, err = timers(api, capsys, "keys", "revoke", "tk_nope")
    assert code == 1 and "tk_nope" in err


def test_usage_shows_the_months_counts(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    api.create(schedule={"type": "every", "seconds": 60})
    used = as_json(timers(api, capsys, "--json", "usage"))
    assert (used["month"], used["timers_created"], used["active_timers"]) == ("2026-11", 1, 1)
    _, out, _ = timers(api, capsys, "usage", "--month", "2026-10")
    assert "2026-10" in out and "timers created" in out
    code, _, err = timers(api, capsys, "usage", "--month", "2026-13")
    assert code == 1 and "month" in err


def test_usage_shows_the_fires_by_lateness_with_their_shares(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    made = api.create(schedule={"type": "every", "seconds": 60})
    for _ in range(2):
        assert timers(api, capsys, "run", made["id"])[0] == 0  # enqueued a few ms after due
    used = as_json(timers(api, capsys, "--json", "usage"))  # the API's answer, unchanged
    assert used == api.call("GET", "/v1/tenant/usage").body
    assert used["lag"]["1-200ms"] == 2 == used["fires"]["enqueued"]
    code, out, _ = timers(api, capsys, "usage")
    assert code == 0
    levels = [line.split() for line in out.split("\n\n")[1].splitlines()]
    assert levels == [
        ["LATENESS", "FIRES", "SHARE"],
        ["ontime", "0", "0.0%"],
        ["1-200ms", "2", "100.0%"],
        ["200-600ms", "0", "0.0%"],
        ["600-1000ms", "0", "0.0%"],
        ["1000-2000ms", "0", "0.0%"],
        ["over_2000ms", "0", "0.0%"],
    ]
    _, out, _ = timers(api, capsys, "usage", "--month", "2026-10")  # no fires: no shares
    assert [line.split()[1:] for line in out.split("\n\n")[1].splitlines()[1:]] == [["0", "-"]] * 6


def test_a_payload_comes_from_a_file_or_standard_input(
    api: Api, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    file = tmp_path / "payload.json"
    file.write_text('{"order": 42, "items": ["β"]}', encoding="utf-8")
    from_file = as_json(timers(api, capsys, "--json", "create", "--in", "1h",
                               "--payload", f"@{file}"))  # fmt: skip
    assert from_file["payload"] == {"order": 42, "items": ["β"]}
    from_stdin = as_json(timers(api, capsys, "--json", "create", "--in", "1h", "--payload", "-",
                                stdin="[1, 2]"))  # fmt: skip
    assert from_stdin["payload"] == [1, 2]
    code, _, err = timers(api, capsys, "create", "--in", "1h", "--payload", "@/nonexistent.json")
    assert code == 2 and "cannot read /nonexistent.json" in err


def test_a_400_reads_once(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = timers(api, capsys, "create", "--every", "0.5s")
    assert code == 1
    assert err.strip() == "timers: 400 validation_error: schedule.seconds: must be at least 1"


def test_an_unreachable_api_is_one_line_saying_what_to_do() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMERS_", "AWS_"))}
    env.update(TIMERS_API=f"http://127.0.0.1:{port}/v1", TIMERS_API_KEY="tk_x")
    run = subprocess.run([str(TIMERS), "ls"], env=env, capture_output=True, text=True,
                         timeout=60, cwd="/")  # fmt: skip
    assert run.returncode == 1
    [line] = run.stderr.splitlines()
    assert line.startswith(f"timers: cannot reach the API at http://127.0.0.1:{port}/v1")
    assert "make run" in line and "TIMERS_API" in line


# ---------------------------------------------------------------- groups


def test_group_option_groups_and_group_actions_with_a_progress_line(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    api.runtime.groups.change_limit = 2  # a few steps, each with its progress line
    made = [as_json(timers(api, capsys, "--json", "create", "--every", "1m",
                           "--group", "order-1"))["id"] for _ in range(5)]  # fmt: skip
    other = as_json(timers(api, capsys, "--json", "create", "--every", "1m"))["id"]
    code, out, _ = timers(api, capsys, "ls", "--group", "order-1")
    assert code == 0 and out.splitlines()[0].split()[-1] == "GROUP"
    assert {line.split()[0] for line in out.splitlines()[1:]} == set(made)
    assert all(line.split()[-1] == "order-1" for line in out.splitlines()[1:])
    code, out, _ = timers(api, capsys, "groups")
    assert (code, out.split()[:3]) == (0, ["GROUP", "CREATED", "order-1"])
    code, out, err = timers(api, capsys, "group", "pause", "order-1")
    assert code == 0, err
    assert out.startswith("paused 5 timers of group order-1")
    progress = err.splitlines()
    assert len(progress) == 3 and progress[-1].endswith("done")
    assert progress[0].startswith("order-1: paused 2 timers (") and "going on" in progress[0]
    statuses = {t["id"]: t["status"] for t in as_json(timers(api, capsys, "--json", "ls"))["items"]}
    assert {statuses[i] for i in made} == {"paused"} and statuses[other] == "active"
    assert as_json(timers(api, capsys, "--json", "group", "resume", "order-1")) == {
        "group": "order-1", "action": "resume", "changed": 5, "done": True}  # fmt: skip
    moved = as_json(timers(api, capsys, "--json", "update", made[0], "--group", "order-2"))
    assert moved["group"] == "order-2"
    left = as_json(timers(api, capsys, "--json", "update", made[1], "--clear", "group"))
    assert left["group"] is None
    code, out, _ = timers(api, capsys, "group", "rm", "order-1")
    assert (code, out.split()[:2]) == (0, ["deleted", "3"])
    code, _, err = timers(api, capsys, "group", "rm", "order-1")
    assert code == 1 and "no group 'order-1'" in err, err
    code, _, err = timers(api, capsys, "create", "--in", "1m", "--group", "a b")
    assert code == 1 and "group" in err


def test_export_and_import_carry_the_group(
    api: Api, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    timers(api, capsys, "create", "--every", "1m", "--group", "keep-me")
    code, out, _ = timers(api, capsys, "export")
    assert code == 0 and json.loads(out.splitlines()[0])["group"] == "keep-me"
    path = tmp_path / "timers.jsonl"
    path.write_text(out)
    assert timers(api, capsys, "import", str(path))[0] == 0
    listed = as_json(timers(api, capsys, "--json", "ls", "--group", "keep-me"))["items"]
    assert len(listed) == 2
