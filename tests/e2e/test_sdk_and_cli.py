"""The SDK and the ``timers`` command against the running local stack, as a user has them: the
console script installed by ``make venv``, configured by env or by ``make run``'s state file.

The stack runs on the wall clock, so waiting for a fire polls with a deadline (no durations are
asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from ops.ports import free_port
from ops.template import ROOT
from tests.support.admin_commands import admin_fails, check_every_admin_command, user_shell
from tests.support.local_stack import RunningStack, admin
from tests.support.readme import code_block, substituted
from timers_client import Client, NotFound, ValidationError, after, at, cron, every

pytestmark = pytest.mark.e2e

TIMERS = Path(sys.executable).parent / "timers"  # the console script
FIRE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def tenant(local_stack: RunningStack) -> dict[str, Any]:
    return admin(local_stack, "tenant", "create", "cli")


@pytest.fixture
def sdk(local_stack: RunningStack, tenant: dict[str, Any]) -> Iterator[Client]:
    with Client(local_stack.api, tenant["api_key"]) as client:
        yield client
        for timer in client.list():  # every test starts from an empty tenant
            client.delete(timer.id)


def cli(
    *args: str, env: dict[str, str], check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TIMERS_", "AWS_"))}
    run = subprocess.run(
        [str(TIMERS), *args], env={**base, **env}, capture_output=True, text=True,
        timeout=timeout, cwd="/",
    )  # fmt: skip
    if check:
        assert run.returncode == 0, run.stderr
    return run


@pytest.fixture
def env(local_stack: RunningStack, tenant: dict[str, Any], sdk: Client) -> dict[str, str]:
    return {"TIMERS_API": local_stack.api, "TIMERS_API_KEY": tenant["api_key"],
            "AWS_ENDPOINT_URL": local_stack.aws_endpoint}  # fmt: skip


def test_the_sdk_does_every_operation(sdk: Client, tenant: dict[str, Any]) -> None:
    assert sdk.health() == {"status": "ok"}
    assert sdk.openapi()["openapi"].startswith("3.1")
    assert sdk.tenant().callback_queue_url == tenant["callback_queue_url"]
    far = "2099-01-01T00:00:00Z"
    timer = sdk.create(every(60), name="e", payload=[1, "x"], start_at=far, idempotency_key="k")
    assert sdk.create(every(60), name="e", payload=[1, "x"], start_at=far,
                      idempotency_key="k").id == timer.id  # fmt: skip
    batch = sdk.create_batch([{"schedule": after(3600)} for _ in range(4)])
    assert sdk.get(timer.id) == timer
    assert {t.id for t in sdk.list(page_size=2)} == {timer.id, *(t.id for t in batch)}
    assert sdk.list_page(limit=2).next_cursor is not None
    patched = sdk.patch(timer.id, name=None, schedule=cron("0 7 * * 1-5", "Europe/Berlin"))
    assert (patched.name, patched.schedule["type"]) == (None, "cron")
    assert sdk.pause(timer.id).status == "paused"
    assert [t.id for t in sdk.list(status="paused")] == [timer.id]
    assert sdk.resume(timer.id).status == "active"
    assert list(sdk.fires(timer.id)) == []
    preview = sdk.preview(cron("0 7 * * 1-5", "Europe/Berlin"), start_at=far, count=3)
    assert preview.fire_times == ["2099-01-01T06:00:00.000Z", "2099-01-02T06:00:00.000Z",
                                  "2099-01-05T06:00:00.000Z"]  # fmt: skip
    sdk.delete(timer.id)
    with pytest.raises(NotFound) as gone:
        sdk.get(timer.id)
    assert gone.value.code == "not_found"
    with pytest.raises(ValidationError) as bad:
        sdk.create(every(0.5))
    assert bad.value.fields == {"schedule.seconds"}


def test_cli_create_fires_and_tail_prints_the_callback_with_its_lag(
    env: dict[str, str], sdk: Client
) -> None:
    created = json.loads(cli("--json", "create", "--in", "1s", "--payload", '{"a":1}',
                             "--name", "hello", env=env).stdout)  # fmt: skip
    assert (created["schedule"], created["payload"]) == ({"type": "after", "seconds": 1.0},
                                                         {"a": 1})  # fmt: skip
    tail = cli("--json", "tail", "--count", "1", "--idle", "60", env=env, timeout=90)
    [line] = tail.stdout.splitlines()
    callback = json.loads(line)
    assert (callback["timer_id"], callback["payload"], callback["name"]) == (
        created["id"], {"a": 1}, "hello",
    )  # fmt: skip
    assert callback["lag_ms"] >= 0  # never early
    deadline = time.monotonic() + FIRE_TIMEOUT_S
    while (fires := json.loads(cli("--json", "fires", created["id"], env=env).stdout)["items"])\
            == [] and time.monotonic() < deadline:  # fmt: skip
        time.sleep(0.5)  # the trigger records the fire just after sending it
    assert [f["status"] for f in fires] == ["enqueued"]
    human = cli("fires", created["id"], env=env).stdout
    assert created["id"] in human and "enqueued" in human
    shown = cli("get", created["id"], env=env).stdout
    assert "completed" in shown and "after 1s" in shown


def test_cli_schedules_tables_and_state_changes(env: dict[str, str], sdk: Client) -> None:
    at = json.loads(cli("--json", "create", "--at", "2099-01-01T00:00:00Z", env=env).stdout)
    every5 = json.loads(cli("--json", "create", "--every", "5s", "--max-fires", "3",
                            "--start", "2099-01-01T00:00:00Z", env=env).stdout)  # fmt: skip
    weekdays = json.loads(cli("--json", "create", "--cron", "0 7 * * 1-5", "--tz",
                              "Europe/Berlin", "--name", "standup", env=env).stdout)  # fmt: skip
    assert at["schedule"] == {"type": "at", "at": "2099-01-01T00:00:00.000Z"}
    assert (every5["schedule"], every5["max_fires"]) == ({"type": "every", "seconds": 5.0}, 3)
    assert weekdays["schedule"] == cron("0 7 * * 1-5", "Europe/Berlin")

    table = cli("ls", env=env).stdout.splitlines()
    assert table[0].split() == ["ID", "STATUS", "SCHEDULE", "NEXT", "FIRE", "FIRES", "NAME",
                                "GROUP"]  # fmt: skip
    rows = {line.split()[0]: line for line in table[1:]}
    assert set(rows) == {at["id"], every5["id"], weekdays["id"]}
    assert "cron '0 7 * * 1-5' Europe/Berlin" in rows[weekdays["id"]]
    assert "standup" in rows[weekdays["id"]]

    assert "paused" in cli("pause", every5["id"], env=env).stdout
    paused = json.loads(cli("--json", "ls", "--status", "paused", env=env).stdout)["items"]
    assert [t["id"] for t in paused] == [every5["id"]]
    assert json.loads(cli("--json", "resume", every5["id"], env=env).stdout)["status"] == "active"
    assert cli("rm", at["id"], every5["id"], env=env).stdout.split() == [
        "deleted", at["id"], "deleted", every5["id"],
    ]  # fmt: skip
    assert [t["id"] for t in json.loads(cli("--json", "ls", env=env).stdout)["items"]] == [
        weekdays["id"]
    ]


def test_cli_quits_quietly_when_its_reader_goes_away(env: dict[str, str], sdk: Client) -> None:
    """``timers ls --json | head -1``: far more than a pipe holds (6 x 50 KB), so the CLI is
    still writing when head exits; it stops with no traceback, exit code 141 (SIGPIPE's)."""
    for _ in range(6):
        sdk.create(at("2099-01-01T00:00:00Z"), payload="x" * 50_000)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TIMERS_", "AWS_"))}
    timers = subprocess.Popen([str(TIMERS), "ls", "--json"], env={**base, **env}, cwd="/",
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert timers.stdout is not None and timers.stderr is not None
    head = subprocess.run(["head", "-1"], stdin=timers.stdout, capture_output=True, timeout=60)
    timers.stdout.close()  # head holds the only reading end now; it has gone
    stderr = timers.stderr.read()
    assert timers.wait(60) == 141, stderr
    assert (head.returncode, head.stdout, stderr) == (0, b"{\n", b"")


def test_cli_rm_tries_every_id_and_reports_each_failure(env: dict[str, str], sdk: Client) -> None:
    one, two = (sdk.create(after(3600)).id for _ in range(2))
    run = cli("rm", "tmr_nope1", one, "tmr_nope2", two, env=env, check=False)
    assert run.returncode == 1
    assert run.stdout.splitlines() == [f"deleted {one}", f"deleted {two}"]
    first, second = run.stderr.splitlines()
    assert first.startswith("timers: tmr_nope1: 404 not_found: ")
    assert second.startswith("timers: tmr_nope2: 404 not_found: ")
    for gone in (one, two):
        with pytest.raises(NotFound):
            sdk.get(gone)
    as_json = cli("--json", "rm", "tmr_nope1", env=env, check=False)
    assert (as_json.returncode, json.loads(as_json.stdout)) == (1, {"deleted": []})
    error = json.loads(as_json.stderr)
    assert (error["id"], error["error"]["code"]) == ("tmr_nope1", "not_found")


def test_cli_update_changes_what_it_is_given_and_clears_with_clear(
    env: dict[str, str], sdk: Client
) -> None:
    made = sdk.create(every(60), name="before", max_fires=5, payload={"v": 1})
    changed = json.loads(cli("--json", "update", made.id, "--name", "standup", "--cron",
                             "0 7 * * 1-5", "--tz", "Europe/Berlin", "--payload", '{"v": 2}',
                             "--clear", "max_fires", env=env).stdout)  # fmt: skip
    assert (changed["id"], changed["name"], changed["payload"], changed["max_fires"]) == (
        made.id, "standup", {"v": 2}, None,
    )  # fmt: skip
    assert changed["schedule"] == cron("0 7 * * 1-5", "Europe/Berlin")
    assert sdk.get(made.id).schedule == cron("0 7 * * 1-5", "Europe/Berlin")
    # Printed as create prints it; one retry bound given keeps the other (retry is for HTTP).
    shown = cli("update", made.id, "--in", "1h", "--url", "https://hooks.example.com/standup",
                "--retry-attempts", "3", env=env).stdout  # fmt: skip
    fields = dict(line.split(None, 1) for line in shown.splitlines())
    assert (fields["id"], fields["schedule"], fields["name"]) == (made.id, "after 3600s", "standup")
    assert (fields["retry"], fields["window_seconds"]) == (
        "max_attempts 3, max_age_seconds -",
        "0s",
    )
    cli("update", made.id, "--retry-max-age", "10m", env=env)
    after_both = sdk.get(made.id)
    assert after_both.retry == {"max_attempts": 3, "max_age_seconds": 600}
    assert after_both.payload == {"v": 2}  # what was not given stays
    cleared = json.loads(cli("--json", "update", made.id, "--clear", "name", "--clear",
                             "payload", env=env).stdout)  # fmt: skip
    assert (cleared["name"], cleared["payload"]) == (None, None)

    # A bad combination: one line on stderr, exit code 2, nothing changed.
    before = sdk.get(made.id)
    for argv, says in [
        (["--name", "x", "--clear", "name"], "timers: --clear name and --name: "),
        (["--in", "5s", "--every", "5s"], "timers update: error: argument --every: not allowed"),
        (["--tz", "UTC"], "timers: --tz is the time zone of a --cron schedule"),
        (["--header", "A: b"], "timers: --header is a request header of an HTTP target"),
        (["--clear", "schedule"], "timers update: error: argument --clear: invalid choice"),
        ([], "timers: nothing to change"),
    ]:
        bad = cli("update", made.id, *argv, env=env, check=False)
        assert bad.returncode == 2, (argv, bad.stderr)
        [line] = bad.stderr.splitlines()
        assert line.startswith(says), (argv, line)
    assert sdk.get(made.id) == before
    missing = cli("update", "tmr_nope", "--name", "x", env=env, check=False)
    assert missing.returncode == 1
    assert missing.stderr.startswith("timers: 404 not_found: ")


def test_cli_preview_and_errors(env: dict[str, str]) -> None:
    times = cli("preview", "--every", "90s", "--start", "2099-01-01T00:00:00Z", "--count", "3",
                env=env).stdout.split()  # fmt: skip
    assert times == ["2099-01-01T00:00:00.000Z", "2099-01-01T00:01:30.000Z",
                     "2099-01-01T00:03:00.000Z"]  # fmt: skip
    bad = cli("create", "--cron", "61 * * * *", env=env, check=False)
    assert bad.returncode == 1
    assert "400 validation_error" in bad.stderr and "schedule.expression" in bad.stderr
    as_json = cli("--json", "get", "tmr_nope", env=env, check=False)
    assert as_json.returncode == 1
    assert json.loads(as_json.stderr)["error"]["code"] == "not_found"
    usage = cli("create", "--in", "soon", env=env, check=False)
    assert usage.returncode == 2 and "not a duration" in usage.stderr


def test_cli_prints_whole_values_never_a_python_repr(
    env: dict[str, str], sdk: Client, tenant: dict[str, Any]
) -> None:
    whoami = dict(line.split(None, 1) for line in cli("whoami", env=env).stdout.splitlines())
    assert set(whoami) == {"tenant", "callback_queue_url", "retention_days"}
    assert whoami["callback_queue_url"] == tenant["callback_queue_url"]  # whole, not cut at 40
    made = json.loads(cli("--json", "create", "--in", "1h", "--url", "https://hooks.example.com/h",
                          "--header", "Authorization: Bearer t0ken", "--payload",
                          '{"order": [1, "x"], "paid": true, "note": null}',
                          "--retry-attempts", "3", env=env).stdout)  # fmt: skip
    shown = cli("get", made["id"], env=env).stdout
    fields = dict(line.split(None, 1) for line in shown.splitlines())
    assert fields["target"] == "https://hooks.example.com/h"
    assert fields["target_headers"].startswith("Authorization: ")  # its value masked by the API
    assert "t0ken" not in shown
    assert json.loads(fields["payload"]) == {"order": [1, "x"], "paid": True, "note": None}
    assert fields["retry"] == "max_attempts 3, max_age_seconds -"
    for python in ("{'", "['", "None", "True", "False"):  # a Python repr anywhere
        assert python not in shown, (python, shown)


def test_cli_usage_says_why_a_month_is_refused(env: dict[str, str]) -> None:
    for month, says in [
        ("2026-13", "month: 2026-13 is out of range: month 13 is not 01-12"),
        ("3000-01", "month: 3000-01 is in the future: this month is "),
        ("2026-1", "month: expected YYYY-MM"),
    ]:
        run = cli("usage", "--month", month, env=env, check=False)
        assert (run.returncode, run.stdout) == (1, ""), run.stderr
        [line] = run.stderr.splitlines()
        assert line.startswith(f"timers: 400 validation_error: {says}"), line
    assert json.loads(cli("--json", "usage", env=env).stdout)["fires"]["enqueued"] >= 0


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080/hook", "https://[::1]/hook", "http://localhost:8080/hook"]
)
def test_a_loopback_webhook_on_the_local_stack_is_refused_naming_the_setting(
    env: dict[str, str], sdk: Client, url: str
) -> None:
    """The shared stack runs as `make run` does, without TIMERS_ALLOW_LOOPBACK_TARGETS."""
    run = cli("create", "--in", "1h", "--url", url, env=env, check=False)
    assert run.returncode == 1
    [line] = run.stderr.splitlines()
    assert line == (
        "timers: 400 validation_error: target.url: is a loopback address: loopback targets "
        "are refused; on the local stack, start it with TIMERS_ALLOW_LOOPBACK_TARGETS=1 to "
        "allow them (plain http too)"
    )
    assert list(sdk.list()) == []


def test_cli_exports_timers_and_imports_them_reporting_each_bad_line(
    env: dict[str, str], sdk: Client, tmp_path: Path
) -> None:
    sdk.create(cron("0 7 * * 1-5", "Europe/Berlin"), name="standup",
                         payload={"room": "β"})  # fmt: skip
    later = sdk.create(after(86_400), name="tomorrow")
    sdk.pause(sdk.create(every(60), name="paused").id)
    exported = cli("export", env=env)
    assert exported.stderr.strip() == "exported 3 timers"
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    by_name = {line["name"]: line for line in lines}
    assert by_name["tomorrow"]["schedule"] == {"type": "at", "at": later.next_fire_at}
    assert by_name["paused"]["status"] == "paused" and "target" not in by_name["standup"]
    for timer in sdk.list():
        sdk.delete(timer.id)

    # The export, 150 more (two requests' worth) and three lines the service or parser refuses.
    many = [json.dumps({"schedule": {"type": "at", "at": "2099-01-01T00:00:00Z"},
                        "name": f"n{i}"}) for i in range(150)]  # fmt: skip
    bad = ['{"schedule": {"type": "cron", "expression": "61 * * * *"}}', "not json",
           '{"schedule": {"type": "every", "seconds": 60}, "colour": "red"}']  # fmt: skip
    file = tmp_path / "timers.jsonl"
    file.write_text("\n".join([*exported.stdout.splitlines(), bad[0], *many, bad[1], bad[2]]))
    run = cli("import", str(file), env=env, check=False)
    assert run.returncode == 1
    head, *failures = run.stdout.splitlines()
    assert head == "imported 153 of 156 timers; 3 failed:"
    assert [line.split(":")[0] for line in failures] == ["  line 4", "  line 155", "  line 156"]
    assert failures[0].startswith("  line 4: schedule.expression: ")
    assert failures[1].startswith("  line 155: not JSON: ")
    assert failures[2] == "  line 156: colour: is not a field of this request"
    assert "156/156" in run.stderr  # the progress, a line per batch off a terminal
    imported = {t.name: t for t in sdk.list()}
    assert len(imported) == 153
    assert imported["standup"].schedule == cron("0 7 * * 1-5", "Europe/Berlin")
    assert imported["standup"].payload == {"room": "β"}
    assert imported["tomorrow"].next_fire_at == later.next_fire_at
    assert imported["paused"].status == "paused"

    # Run again within 24 h: the same batches, the same timers - nothing created twice.
    again = json.loads(cli("--json", "import", str(file), env=env, check=False).stdout)
    assert len(again["created"]) == 153 and len(list(sdk.list())) == 153


def test_an_import_never_fires_again_what_already_fired(
    env: dict[str, str], sdk: Client, tmp_path: Path
) -> None:
    """Exported with status and fire count: a completed one-shot, and a recurring timer that
    reached max_fires, are skipped by import; one part-way keeps only the fires it has left."""
    once = sdk.create(after(0), name="once")
    twice = sdk.create(every(1), max_fires=2, name="twice")
    many = sdk.create(every(1), max_fires=1_000, name="many")
    deadline = time.monotonic() + FIRE_TIMEOUT_S
    while not (sdk.get(once.id).status == sdk.get(twice.id).status == "completed"
               and sdk.get(many.id).fire_count >= 2):  # fmt: skip
        assert time.monotonic() < deadline, "the timers did not fire"
        time.sleep(0.5)
    exported = cli("export", env=env)
    lines = {line["name"]: line for line in map(json.loads, exported.stdout.splitlines())}
    assert (lines["once"]["status"], lines["once"]["fire_count"]) == ("completed", 1)
    assert (lines["twice"]["status"], lines["twice"]["fire_count"]) == ("completed", 2)
    assert lines["many"]["status"] == "active" and lines["many"]["fire_count"] >= 2
    for timer in sdk.list():
        sdk.delete(timer.id)

    file = tmp_path / "timers.jsonl"
    file.write_text(exported.stdout)
    run = cli("import", str(file), env=env)
    assert run.stdout.splitlines() == [
        "imported 1 of 3 timers; 2 skipped (completed: what fired never fires again)"
    ]
    (imported,) = sdk.list()
    assert (imported.name, imported.status) == ("many", "active")
    assert imported.max_fires == 1_000 - lines["many"]["fire_count"]
    assert "completed ones are skipped" in " ".join(cli("import", "--help", env=env).stdout.split())


def test_a_key_revoked_with_ops_admin_is_refused_within_a_second(
    local_stack: RunningStack,
) -> None:
    key = admin(local_stack, "tenant", "create", "revoke-me")["api_key"]
    for _ in range(20):  # every api sandbox that serves these now remembers the key
        assert local_stack.request("GET", "/tenant", key=key)[0] == 200
    assert admin(local_stack, "key", "revoke", key) == {"revoked": True}
    revoked = time.monotonic()
    while (status := local_stack.request("GET", "/tenant", key=key)[0]) == 200:
        assert time.monotonic() - revoked < 1.0, "a revoked key still works after a second"
        time.sleep(0.05)
    assert status == 401


def test_cli_finds_make_runs_api_and_demo_key_in_its_state_file(
    local_stack: RunningStack,
) -> None:
    state_dir = local_stack.env["LOCAL_STATE_DIR"]
    whoami = json.loads(cli("--json", "whoami", env={"LOCAL_STATE_DIR": state_dir}).stdout)
    assert whoami["tenant"] == "demo"
    assert whoami["callback_queue_url"] == local_stack.ready["Tenant demo callback queue: "]
    nothing = cli("ls", env={"LOCAL_STATE_DIR": "/nonexistent"}, check=False)
    assert nothing.returncode == 2 and "TIMERS_API" in nothing.stderr


def test_every_admin_command_works_from_the_shell_that_ran_make_run(
    local_stack: RunningStack,
) -> None:
    check_every_admin_command(local_stack, "admin-moto")


def test_admin_says_in_one_line_what_it_cannot_reach(local_stack: RunningStack) -> None:
    nowhere = free_port()
    no_stack = user_shell(local_stack, AWS_PORT=str(nowhere), LOCAL_STATE_DIR="/nonexistent")
    assert admin_fails(local_stack, "tenant", "create", "x", env=no_stack) == (
        f"ops.admin: no local stack answers at http://127.0.0.1:{nowhere}: start one with "
        "make run (or ENV=aws for the deployed stack)"
    )
    # moto answers, but the DynamoDB Local the shell names does not
    no_dynamodb = user_shell(local_stack, DYNAMODB="local", DYNAMODB_PORT=str(nowhere),
                             LOCAL_STATE_DIR="/nonexistent")  # fmt: skip
    line = admin_fails(local_stack, "tenant", "create", "x", env=no_dynamodb)
    assert line.startswith(
        f"ops.admin: the local stack's DynamoDB does not answer at http://127.0.0.1:{nowhere} "
    )


def shell_env(**settings: str) -> dict[str, str]:
    """A user's shell: none of the suite's AWS, TIMERS_ or stack settings, plus ``settings``."""
    drop = ("TIMERS_", "AWS_", "LOCAL_STATE_DIR")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **settings}


def test_the_docs_sdk_example_runs_twice_from_anywhere_and_leaves_nothing(
    local_stack: RunningStack, tmp_path: Path
) -> None:
    key = admin(local_stack, "tenant", "create", "readme-sdk")["api_key"]
    example = tmp_path / "example.py"
    example.write_text(code_block("## The SDK", "python", ROOT / "docs" / "cli-and-sdk.md"))
    env = shell_env(TIMERS_API=local_stack.api, TIMERS_API_KEY=key)
    for _ in range(2):
        run = subprocess.run([sys.executable, str(example)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert run.stdout.rstrip().endswith("is gone")
    with Client(local_stack.api, key) as client:
        assert list(client.list()) == []
    # No TIMERS_API, and no `make run` found from here: the error says what to set.
    lost = subprocess.run([sys.executable, str(example)], env=shell_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert lost.returncode == 1
    last = lost.stderr.splitlines()[-1]
    assert last.startswith("timers_client.client.ApiConfigError: set TIMERS_API to the API's ")


def test_the_readmes_curl_example_reads_the_callback_of_its_own_timer(
    local_stack: RunningStack, tmp_path: Path
) -> None:
    tenant = admin(local_stack, "tenant", "create", "readme-curl")
    queue = tenant["callback_queue_url"]
    sqs = boto3.client("sqs", endpoint_url=local_stack.aws_endpoint, region_name="us-east-1",
                       aws_access_key_id="local", aws_secret_access_key="local")  # fmt: skip
    with Client(local_stack.api, tenant["api_key"]) as client:
        other = client.create(after(0), payload="another callback, first in the queue")
        deadline = time.monotonic() + FIRE_TIMEOUT_S
        while sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"][
            "ApproximateNumberOfMessages"
        ] == "0":  # fmt: skip
            assert time.monotonic() < deadline, "the other timer did not fire"
            time.sleep(0.2)
        script = substituted(
            code_block("The same with curl", "bash"),
            {
                "KEY=tk_...": f"KEY={tenant['api_key']}",
                "http://127.0.0.1:4566/123456789012/timers-tenant-demo": queue,
                "http://127.0.0.1:3000/v1": local_stack.api,
                "http://127.0.0.1:4566": local_stack.aws_endpoint,
                ".venv/bin/python": sys.executable,
            },
        )
        run = subprocess.run(["bash", "-c", script], env=shell_env(), cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 0, run.stderr
        created, callback = run.stdout.splitlines()
        timer_id = created.removeprefix("created ")
        assert timer_id != other.id and client.get(timer_id).payload == {"hello": "world"}
        body = json.loads(callback)
        assert (body["timer_id"], body["payload"]) == (timer_id, {"hello": "world"})
        counts = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
        waiting = int(counts["ApproximateNumberOfMessages"])
        assert waiting + int(counts["ApproximateNumberOfMessagesNotVisible"]) == 1  # the other's
        for timer in client.list():
            client.delete(timer.id)


def test_groups_through_the_sdk_and_the_cli(env: dict[str, str], sdk: Client) -> None:
    """A group made with the SDK and the CLI, listed, paused, resumed and deleted through the
    installed ``timers`` command (a progress line per call on stderr), then gone (404)."""
    made = [sdk.create(every(3600), group="order-7").id for _ in range(3)]
    made.append(json.loads(cli("--json", "create", "--every", "1h", "--group", "order-7",
                               env=env).stdout)["id"])  # fmt: skip
    other = sdk.create(every(3600), group="order-8").id
    assert sorted(t.id for t in sdk.list(group="order-7")) == sorted(made)
    assert [g.name for g in sdk.groups()] == ["order-7", "order-8"]
    assert cli("groups", env=env).stdout.split()[2:5:2] == ["order-7", "order-8"]
    listed = cli("ls", "--group", "order-7", env=env).stdout.splitlines()
    assert {line.split()[-1] for line in listed[1:]} == {"order-7"} and len(listed) == 5
    paused = cli("group", "pause", "order-7", env=env)
    assert paused.stdout.startswith("paused 4 timers of group order-7")
    assert paused.stderr.splitlines()[-1].startswith("order-7: paused 4 timers (")
    assert {sdk.get(i).status for i in made} == {"paused"} and sdk.get(other).status == "active"
    assert sdk.resume_group("order-7").changed == 4
    assert sdk.patch(made[0], group=None).group is None
    assert cli("group", "rm", "order-7", env=env).stdout.startswith("deleted 3 timers")
    with pytest.raises(NotFound):
        sdk.delete_group("order-7")
    gone = cli("group", "rm", "order-7", env=env, check=False)
    assert gone.returncode == 1 and "no group 'order-7'" in gone.stderr
    with pytest.raises(ValidationError) as bad:
        sdk.create(every(60), group="a b")
    assert [d.field for d in bad.value.details] == ["group"]
