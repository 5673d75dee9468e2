"""``timers``: the timer service from a shell, on the SDK.

    timers create --in 30s --payload '{"a":1}'
    timers create --cron '0 7 * * 1-5' --tz Europe/Berlin --name standup
    timers ls | timers get ID | timers fires ID | timers pause|resume|reset ID | timers rm ID...
    timers update ID --name standup --cron '0 8 * * 1-5' --clear max_fires
    timers run ID                    # one extra fire now, besides the schedule
    timers keys ls | timers keys create [--label L] | timers keys revoke KEY_ID
    timers usage [--month 2026-11]   # fires enqueued, delivered, failed, late; timers
    timers preview --every 90s --count 5
    timers failed --since 2026-11-21T00:00:00Z     # webhook fires whose delivery gave up
    timers redeliver ID [FIRE_ID]    # one failed fire again, or every failed fire of ID
    timers tail                      # the tenant's callbacks as they arrive, with their lag
    timers create --in 1h --group order-1234 ; timers ls --group order-1234
    timers groups                    # the tenant's groups
    timers group pause|resume|rm NAME    # every timer of the group, with a progress line
    timers export > timers.jsonl     # every timer, one JSON object per line
    timers import timers.jsonl       # create them (100 per request), report what failed

Configuration: ``--api``/``--api-key``, else ``TIMERS_API``/``TIMERS_API_KEY``, else the running
``make run`` (its state file: its API and the demo tenant's key). Tables for people by default;
``--json`` prints the API's JSON (one object per line for ``tail``) for scripts. ``--json``,
``--api`` and ``--api-key`` go before or after the command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx

from timers_client import bulk
from timers_client.client import NUMBER, ApiConfigError, Client, Config, after, at, cron, every
from timers_client.errors import ApiError

_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(rf"({NUMBER.pattern})(ms|s|m|h|d)")  # ASCII digits: not ``\d``


def whole_number(text: str) -> int:
    """A count (``--limit 20``) in ASCII digits: ``int()`` takes any script's."""
    if not re.fullmatch(r"[0-9]+", text):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(text)


def whole_seconds(text: str) -> int:
    """A duration (``90s``, ``2h``) in whole seconds."""
    seconds = duration(text)
    if seconds != int(seconds):
        raise argparse.ArgumentTypeError("expected whole seconds")
    return int(seconds)


def duration(text: str) -> float:
    """Seconds of ``30``, ``30s``, ``1.5s``, ``250ms``, ``5m``, ``1h30m``, ``2d``."""
    text = text.strip().lower()
    if NUMBER.fullmatch(text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 5m, 1h30m)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def payload_value(text: str) -> Any:
    """A JSON value given inline, as ``@FILE`` (read from that file) or as ``-`` (stdin)."""
    where = "standard input" if text == "-" else text[1:] if text.startswith("@") else None
    try:
        if text == "-":
            text = sys.stdin.read()
        elif text.startswith("@"):
            text = Path(text[1:]).read_text(encoding="utf-8")
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {where}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        source = f" in {where}" if where else ""
        raise argparse.ArgumentTypeError(f"not JSON{source}: {exc}") from None


# ---------------------------------------------------------------- output


def _short(value: Any, width: int | None = 40) -> str:
    text = "-" if value is None else value if isinstance(value, str) else json.dumps(value)
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def schedule_text(schedule: dict[str, Any]) -> str:
    kind = schedule.get("type")
    if kind == "at":
        return f"at {schedule['at']}"
    if kind in ("after", "every"):
        return f"{kind} {schedule['seconds']:g}s"
    if kind == "cron":
        return f"cron '{schedule['expression']}' {schedule.get('timezone', 'UTC')}"
    return json.dumps(schedule)


CUT = {"NAME": 40}
"""The one column a table cuts (at 40 characters): a timer's name, free text of up to 256
characters that ``timers get`` shows whole. Every other value is printed whole - ids, which
other commands take, queue URLs, reasons - as a value cut short is one a user cannot use."""


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    widths_cap = [CUT.get(h) for h in headers]
    cells = [list(headers)] + [
        [_short(c, cap) for c, cap in zip(row, widths_cap, strict=True)] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def zone_of(schedule: dict[str, Any]) -> ZoneInfo | None:
    """The time zone a schedule is written in, when it is not UTC (a cron's)."""
    name = schedule.get("timezone") if schedule.get("type") == "cron" else None
    if not name or name == "UTC":
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def in_zone(iso: str, zone: ZoneInfo | None, form: str = "%Y-%m-%d %H:%M %Z") -> str:
    """An API time (UTC), with the wall-clock time of ``zone`` beside it."""
    if zone is None:
        return iso
    local = datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(zone)
    return f"{iso} ({local.strftime(form)})"


def next_fire_text(timer: Any, form: str = "%a %H:%M %Z") -> str:
    """The next fire as people read it: in the schedule's time zone too; none while paused
    (resuming decides it, by the misfire policy)."""
    if timer.status == "paused":
        return "- (paused)"
    if timer.next_fire_at is None:
        return "-"
    return in_zone(timer.next_fire_at, zone_of(timer.schedule), form)


def timer_rows(timers: Iterable[Any]) -> list[list[Any]]:
    return [
        [t.id, t.status, schedule_text(t.schedule), next_fire_text(t), t.fire_count, t.name,
         t.group]
        for t in timers
    ]  # fmt: skip


TIMER_HEADERS = ("ID", "STATUS", "SCHEDULE", "NEXT FIRE", "FIRES", "NAME", "GROUP")


def value_text(value: Any) -> str:
    """A value as people read it, whole: none is ``-``, text as it is, anything else as JSON
    (never a Python repr: ``{"a": 1}``, ``true``, ``["x"]``)."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def fields_text(data: dict[str, Any]) -> str:
    """One record, a line per field: its name, then its whole value."""
    width = max(len(k) for k in data)
    return "\n".join(f"{k.ljust(width)}  {value_text(v)}" for k, v in data.items())


def show_timer(timer: Any) -> str:
    data = asdict(timer)
    data["schedule"] = schedule_text(timer.schedule)
    data["next_fire_at"] = next_fire_text(timer, "%Y-%m-%d %H:%M %Z")
    data["target"] = timer.target.get("queue_url") or timer.target.get("url")
    if headers := timer.target.get("headers"):  # right after the URL, values masked by the API
        shown = ", ".join(f"{name}: {value}" for name, value in headers.items())
        with_headers: dict[str, Any] = {}
        for key, value in data.items():
            with_headers[key] = value
            if key == "target":
                with_headers["target_headers"] = shown
        data = with_headers
    data["payload"] = json.dumps(timer.payload, ensure_ascii=False)
    data["window_seconds"] = f"{timer.window_seconds:g}s"
    if timer.retry is not None:  # "max_attempts 3, max_age_seconds -", not a Python dict
        data["retry"] = ", ".join(f"{k} {'-' if v is None else v}" for k, v in timer.retry.items())
    return fields_text(data)


# ---------------------------------------------------------------- commands


def _schedule_given(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.in_, args.at, args.every, args.cron))


def _schedule(args: argparse.Namespace) -> dict[str, Any]:
    if args.in_ is not None:
        return after(args.in_)
    if args.at is not None:
        return at(args.at)
    if args.every is not None:
        return every(args.every)
    return cron(args.cron, args.tz or "UTC")


def header_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError("expected 'Name: value'")
    return name.strip(), value.strip()


def _target(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.header and not args.url:
        raise UsageError("--header is a request header of an HTTP target: give --url too")
    if args.url:
        return {"url": args.url, **({"headers": dict(args.header)} if args.header else {})}
    return {"queue_url": args.queue_url} if args.queue_url else None


def _retry(args: argparse.Namespace) -> dict[str, Any] | None:
    retry = {k: v for k, v in (("max_attempts", args.retry_attempts),
             ("max_age_seconds", args.retry_max_age)) if v is not None}  # fmt: skip
    return retry or None


def cmd_create(client: Client, args: argparse.Namespace) -> Any:
    timer = client.create(
        _schedule(args), name=args.name, start_at=args.start, end_at=args.end,
        max_fires=args.max_fires, target=_target(args), payload=args.payload,
        misfire=args.misfire, retry=_retry(args), window=args.window, group=args.group,
        idempotency_key=args.idempotency_key,
    )  # fmt: skip
    return timer, lambda: show_timer(timer)


def cmd_whoami(client: Client, args: argparse.Namespace) -> Any:
    tenant = client.tenant()  # a line per field, each whole (--json has the webhook secret)
    return tenant, lambda: fields_text({"tenant": tenant.tenant,
                                        "callback_queue_url": tenant.callback_queue_url,
                                        "retention_days": tenant.retention_days})  # fmt: skip


KEY_HEADERS = ("KEY ID", "CREATED", "LAST USED", "LABEL")


def cmd_keys_ls(client: Client, args: argparse.Namespace) -> Any:
    keys = client.keys()
    rows = [[k.key_id, k.created_at, k.last_used_at, k.label] for k in keys]
    return {"items": keys}, lambda: table(KEY_HEADERS, rows)


def cmd_keys_create(client: Client, args: argparse.Namespace) -> Any:
    key = client.create_key(label=args.label)
    return key, lambda: f"{key.api_key}\n(key {key.key_id}: the secret above is shown this once)"


def cmd_keys_revoke(client: Client, args: argparse.Namespace) -> Any:
    client.revoke_key(args.key_id)
    return {"revoked": args.key_id}, lambda: f"revoked {args.key_id}"


def cmd_usage(client: Client, args: argparse.Namespace) -> Any:
    used = client.usage(args.month)
    fires = used["fires"]
    rows = [["fires enqueued", fires["enqueued"]], ["fires delivered", fires["delivered"]],
            ["fires failed", fires["failed"]], ["fires late > 1 s", fires["late_1s"]],
            ["timers created", used["timers_created"]], ["timers active now",
            used["active_timers"]]]  # fmt: skip
    lag = used.get("lag") or {}  # the enqueued fires by lateness, earliest level first
    total = sum(lag.values())
    levels = [[level, n, f"{100 * n / total:.1f}%" if total else "-"] for level, n in lag.items()]

    def show() -> str:
        counts = table((used["month"], ""), rows)
        return f"{counts}\n\n{table(('LATENESS', 'FIRES', 'SHARE'), levels)}" if lag else counts

    return used, show


def cmd_ls(client: Client, args: argparse.Namespace) -> Any:
    timers = list(client.list(status=args.status, group=args.group))
    if args.limit is not None:
        timers = timers[: args.limit]
    return {"items": timers}, lambda: table(TIMER_HEADERS, timer_rows(timers))


def cmd_get(client: Client, args: argparse.Namespace) -> Any:
    timer = client.get(args.id)
    return timer, lambda: show_timer(timer)


def cmd_fires(client: Client, args: argparse.Namespace) -> Any:
    fires = []
    for fire in client.fires(args.id):
        fires.append(fire)
        if args.limit is not None and len(fires) >= args.limit:
            break
    return {"items": fires}, lambda: fires_text(fires)


FIRE_HEADERS = ("FIRE ID", "SCHEDULED", "ENQUEUED", "DELIVERED", "LAG MS", "STATUS")
HTTP_FIRE_HEADERS = ("ATTEMPTS", "LAST STATUS")


def fires_text(fires: Sequence[Any]) -> str:
    """A row per fire, whole; an HTTP target's fires add their attempts and last status. A
    fire's long values - its reason, its last failed answer - follow it on lines of their own,
    indented, so nothing is cut and the columns stay readable."""
    http = any(f.attempts is not None for f in fires)
    headers = (*FIRE_HEADERS, *(HTTP_FIRE_HEADERS if http else ()))
    rows = [[f.fire_id, f.scheduled_at, f.enqueued_at, f.delivered_at, f.lag_ms, f.status,
             *([f.attempts, f.last_status] if http else [])] for f in fires]  # fmt: skip
    lines = table(headers, rows).split("\n")
    out = lines[:1]
    for fire, line in zip(fires, lines[1:], strict=True):
        out.append(line)
        if fire.reason:
            out.append(f"    reason: {fire.reason}")
        if fire.last_error:
            out.append(f"    last error: {last_error_text(fire.last_error)}")
    return "\n".join(out)


def last_error_text(error: dict[str, Any]) -> str:
    """An HTTP fire's last failed attempt: ``http 503 after 41 ms, body "down"``, or
    ``timeout after 10000 ms``; the body (at most 512 bytes) whole, quoted on one line."""
    status = error.get("status")
    what = f"http {status}" if status is not None else error.get("error") or "no answer"
    text = f"{what} after {error.get('latency_ms', '-')} ms"
    if error.get("body"):
        text += f", body {json.dumps(error['body'], ensure_ascii=False)}"
    return text


FAILED_HEADERS = ("FAILED AT", "FIRE ID", "ATTEMPTS", "LAST STATUS")


def failed_rows(fires: Sequence[Any], redelivered: bool = False) -> list[list[Any]]:
    """The reason last: whole, it is as long as it needs to be."""
    return [[f.failed_at, f.fire_id, f.attempts, f.last_status,
             *([f.redelivered_at] if redelivered else []), f.reason] for f in fires]  # fmt: skip


def cmd_failed(client: Client, args: argparse.Namespace) -> Any:
    fires = []
    listing = client.failed_fires(since=args.since, until=args.until, include_redelivered=args.all)
    for fire in listing:
        fires.append(fire)
        if args.limit is not None and len(fires) >= args.limit:
            break
    headers = (*FAILED_HEADERS, *(["REDELIVERED AT"] if args.all else []), "REASON")
    return {"items": fires}, lambda: table(headers, failed_rows(fires, args.all))


def cmd_redeliver(client: Client, args: argparse.Namespace) -> Any:
    if args.fire_id is not None:
        fires = [client.redeliver(args.id, failed_fire_id(client, args.id, args.fire_id))]
    else:
        fires = client.redeliver_all(args.id)
    text = "\n".join(f"redelivered {f.fire_id}" for f in fires) or "(no failed fire to redeliver)"
    return {"items": fires}, lambda: text


class UsageError(Exception):
    """What the user typed names nothing (exit code 2, like a usage error)."""


def failed_fire_id(client: Client, timer_id: str, given: str) -> str:
    """The failed fire of the timer whose id is ``given`` or starts with it (unique)."""
    if re.fullmatch(r".+:[0-9]{13,}", given):
        return given  # a whole fire id: the API says whether it failed
    matches = [f.fire_id for f in client.failed_fires() if f.timer_id == timer_id
               and f.fire_id.startswith(given)]  # fmt: skip
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"no failed fire of {timer_id} starts with {given!r} (timers failed)")
    shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
    raise UsageError(f"{given!r} is the start of {len(matches)} failed fires: {shown}")


def _state_change(name: str) -> Callable[[Client, argparse.Namespace], Any]:
    def run(client: Client, args: argparse.Namespace) -> Any:
        timer = getattr(client, name)(args.id)
        return timer, lambda: table(TIMER_HEADERS, timer_rows([timer]))

    return run


def cmd_run(client: Client, args: argparse.Namespace) -> Any:
    fire = client.run(args.id)
    return fire, lambda: f"fired {fire.fire_id} ({fire.status} at {fire.enqueued_at or '-'})"


def cmd_rm(client: Client, args: argparse.Namespace) -> Any:
    """Every id is tried; each one that fails is a line on stderr, and the exit code is 1 if
    any did (as rm does)."""
    deleted = []
    for timer_id in args.ids:
        try:
            client.delete(timer_id)
        except ApiError as exc:
            print(error_line(exc, args.json, timer_id), file=sys.stderr)
            continue
        deleted.append(timer_id)
    text = "\n".join(f"deleted {i}" for i in deleted)
    return {"deleted": deleted}, lambda: text, 0 if len(deleted) == len(args.ids) else 1


NOT_GIVEN: Any = object()
"""An option of ``timers update`` that was not given: that field is left as it is."""


def _given(value: Any) -> Any:
    return NOT_GIVEN if value is None else value


# What `timers update` sends, by PATCH field: the value its options give, else NOT_GIVEN. A new
# field (--window: window_seconds; --group: group) is an option in _timer_options, a line here,
# its options in FIELD_OPTIONS and, if null clears it, its name in CLEARABLE.
UPDATE_FIELDS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "name": lambda a: _given(a.name),
    "schedule": lambda a: _schedule(a) if _schedule_given(a) else NOT_GIVEN,
    "start_at": lambda a: _given(a.start),
    "end_at": lambda a: _given(a.end),
    "max_fires": lambda a: _given(a.max_fires),
    "target": lambda a: _given(_target(a)),
    "payload": lambda a: a.payload,  # NOT_GIVEN by default: --payload null is JSON null
    "misfire": lambda a: _given(a.misfire),
    "retry": lambda a: _given(_retry(a)),
    "window": lambda a: _given(a.window),
    "group": lambda a: _given(a.group),
}
FIELD_OPTIONS = {
    "name": "--name", "schedule": "--in/--at/--every/--cron", "start_at": "--start",
    "end_at": "--end", "max_fires": "--max-fires", "target": "--queue-url/--url",
    "payload": "--payload", "misfire": "--misfire", "retry": "--retry-attempts/--retry-max-age",
    "window": "--window", "group": "--group",
}  # fmt: skip
CLEARABLE = ("name", "start_at", "end_at", "max_fires", "target", "payload", "retry", "group")
"""The fields a PATCH's null clears (``--clear FIELD``); a schedule and misfire cannot be."""


def update_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The PATCH body's fields from ``timers update``'s options (a UsageError if they clash)."""
    changes = {field: value for field, read in UPDATE_FIELDS.items()
               if (value := read(args)) is not NOT_GIVEN}  # fmt: skip
    for field in args.clear or []:
        if field in changes:
            raise UsageError(f"--clear {field} and {FIELD_OPTIONS[field]}: set it or clear it")
        changes[field] = None
    if not changes:
        raise UsageError("nothing to change: give an option (timers update --help)")
    return changes


def cmd_update(client: Client, args: argparse.Namespace) -> Any:
    changes = update_changes(args)
    retry = changes.get("retry")
    if retry is not None and len(retry) == 1:  # one bound given: the other stays as it is
        changes["retry"] = {**(client.get(args.id).retry or {}), **retry}
    timer = client.patch(args.id, **changes)
    return timer, lambda: show_timer(timer)


def cmd_preview(client: Client, args: argparse.Namespace) -> Any:
    preview = client.preview(
        _schedule(args), start_at=args.start, end_at=args.end, max_fires=args.max_fires,
        count=args.count,
    )  # fmt: skip
    zone = zone_of(_schedule(args))
    return preview, lambda: "\n".join(in_zone(t, zone) for t in preview.fire_times) or "(no fire)"


def cmd_tail(client: Client, args: argparse.Namespace, config: Config) -> int:
    """Print the tenant's callbacks as they arrive (and delete them: tail consumes the queue)."""
    import boto3  # only this command talks to AWS

    queue_url = client.tenant().callback_queue_url
    options: dict[str, Any] = {}
    if config.aws_endpoint:  # the local stack's moto takes any credentials
        options = {"endpoint_url": config.aws_endpoint, "aws_access_key_id": "local",
                   "aws_secret_access_key": "local", "region_name": "us-east-1"}  # fmt: skip
    sqs = boto3.client("sqs", **options)
    seen, idle_since = 0, time.monotonic()
    if not args.json:
        print(f"tailing {queue_url} (Ctrl-C to stop)", file=sys.stderr)
    from botocore.exceptions import EndpointConnectionError

    while args.count is None or seen < args.count:
        if args.idle is not None and time.monotonic() - idle_since > args.idle:
            break
        wait = 1 if args.idle is not None else 10
        try:
            got = sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait,
                MessageAttributeNames=["All"],
            ).get("Messages", [])  # fmt: skip
        except EndpointConnectionError as exc:
            where = exc.kwargs.get("endpoint_url")
            print(f"timers: cannot reach the queue at {where}; is the local stack running "
                  "(`make run`)? Otherwise set AWS_ENDPOINT_URL or your AWS region.",
                  file=sys.stderr)  # fmt: skip
            return 1
        for message in got:
            print(callback_line(json.loads(message["Body"]), args.json), flush=True)
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            seen += 1
            idle_since = time.monotonic()
            if args.count is not None and seen >= args.count:
                break
    return 0


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def callback_line(body: dict[str, Any], as_json: bool) -> str:
    lag_ms = _ms(body["fired_at"]) - _ms(body["scheduled_at"])
    if as_json:
        return json.dumps({**body, "lag_ms": lag_ms})
    return (f"{body['fired_at']}  {body['timer_id']}  lag {lag_ms:>5} ms  "
            f"{_short(body.get('name'), 20)}  {_short(body.get('payload'), 60)}")  # fmt: skip


# ---------------------------------------------------------------- arguments


def _schedule_options(parser: argparse.ArgumentParser, required: bool) -> None:
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--in", dest="in_", type=duration, metavar="DURATION",
                       help="once, this long from now (30s, 5m, 1h30m)")  # fmt: skip
    group.add_argument("--at", metavar="TIME", help="once, at this RFC 3339 time")
    group.add_argument("--every", type=duration, metavar="DURATION", help="every 5s, 1m, ...")
    group.add_argument("--cron", metavar="EXPR", help="5-field cron, e.g. '0 7 * * 1-5'")
    parser.add_argument("--tz", help="with --cron: its IANA time zone (default UTC)")
    parser.add_argument("--start", metavar="TIME", help="no fire before this RFC 3339 time")
    parser.add_argument("--end", metavar="TIME", help="no fire after this RFC 3339 time")
    parser.add_argument("--max-fires", type=whole_number, metavar="N")


def _timer_options(parser: argparse.ArgumentParser) -> None:
    """What a timer is made of besides its schedule: create's options, and update's."""
    parser.add_argument("--name")
    parser.add_argument("--payload", type=payload_value, metavar="JSON|@FILE|-",
                        help="any JSON value, delivered verbatim; @FILE reads it from FILE, "
                        "- from standard input")  # fmt: skip
    parser.add_argument("--misfire", choices=["fire_once", "fire_all", "skip"])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--queue-url", help="target queue (default: the tenant's)")
    where.add_argument("--url", help="HTTP target: POST there, signed (Standard Webhooks)")
    parser.add_argument("--header", type=header_value, action="append",
                        help="with --url: 'Name: value', repeatable")  # fmt: skip
    parser.add_argument("--retry-attempts", type=whole_number, metavar="N",
                        help="an HTTP fire is POSTed at most N times (1..100)")  # fmt: skip
    parser.add_argument("--retry-max-age", type=whole_seconds, metavar="DURATION",
                        help="an HTTP fire is retried until this long after its due time "
                        "(60s..24h)")  # fmt: skip
    parser.add_argument("--window", type=duration, metavar="DURATION",
                        help="the flexible window (0s..15m): each fire lands in [due, due + "
                        "window], at a moment that batches it with others - cheaper")  # fmt: skip
    parser.add_argument("--group", metavar="NAME",
                        help="the group it is in (1-64 of A-Z a-z 0-9 . _ -): paused, resumed "
                        "or deleted with the group's other timers (timers group ...)")  # fmt: skip


def cmd_groups(client: Client, args: argparse.Namespace) -> Any:
    groups = list(client.groups())
    rows = [[g.name, g.created_at] for g in groups]
    return {"items": groups}, lambda: table(("GROUP", "CREATED"), rows)


GROUP_ACTIONS = {"pause": ("pause_group", "paused"), "resume": ("resume_group", "resumed"),
                 "rm": ("delete_group", "deleted")}  # fmt: skip


def cmd_group(client: Client, args: argparse.Namespace) -> Any:
    """Every timer of the group, call after call until the API says done; a progress line on
    stderr per call (standard output is the result)."""
    method, done_word = GROUP_ACTIONS[args.group_action]
    started = time.monotonic()
    so_far = 0

    def step(change: Any) -> None:
        nonlocal so_far
        so_far += change.changed
        rate = so_far / max(time.monotonic() - started, 1e-3)
        state = "done" if change.done else "going on"
        print(f"{args.name}: {done_word} {so_far} timers ({rate:.0f}/s), {state}",
              file=sys.stderr, flush=True)  # fmt: skip

    total = getattr(client, method)(args.name, on_step=None if args.json else step)
    took = time.monotonic() - started
    return total, lambda: f"{done_word} {total.changed} timers of group {args.name} in {took:.1f}s"


def cmd_export(client: Client, args: argparse.Namespace) -> Any:
    default_queue = client.tenant().callback_queue_url
    count = 0
    for timer in client.list(status=args.status, page_size=100):
        print(bulk.export_line(timer, default_queue), file=args.out)
        count += 1
    args.out.flush()
    print(f"exported {count} timers", file=sys.stderr)  # standard output is the data
    return None, lambda: None


def cmd_import(client: Client, args: argparse.Namespace) -> Any:
    report = bulk.ImportReport()
    lines = list(bulk.parse_lines(args.file, report))
    progress = Progress(len(lines) + len(report.failed), sys.stderr)
    progress.show(len(report.failed))

    def create(bodies: list[dict[str, Any]], key: str) -> list[Any]:
        return client.create_batch(bodies, idempotency_key=key)

    for batch in bulk.batches(lines):
        bulk.import_batch(batch, create, client.pause, report)
        progress.show(report.total)
    progress.done()
    failed = sorted(report.failed)
    result = {
        "created": [{"line": line.number, "id": t.id, "was": line.was}
                    for line, t in report.created],
        "skipped": [{"line": number, "was": was, "reason": SKIPPED}
                    for number, was in report.skipped],
        "failed": [{"line": number, "reason": why} for number, why in failed],
    }  # fmt: skip

    def human() -> str:
        head = f"imported {len(report.created)} of {report.total} timers"
        if report.skipped:
            head += f"; {len(report.skipped)} skipped ({SKIPPED})"
        if not failed:
            return head
        return "\n".join([f"{head}; {len(failed)} failed:",
                          *(f"  line {n}: {why}" for n, why in failed)])  # fmt: skip

    return result, human, 1 if failed else 0


SKIPPED = "completed: what fired never fires again"


class Progress:
    """A progress bar on a terminal; on anything else, a line per step."""

    WIDTH = 30

    def __init__(self, total: int, stream: Any) -> None:
        self.total, self.stream = max(total, 1), stream
        self.live = bool(getattr(stream, "isatty", lambda: False)())

    def show(self, done: int) -> None:
        filled = self.WIDTH * done // self.total
        bar = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total}"
        print(("\r" if self.live else "") + bar, end="" if self.live else "\n",
              file=self.stream, flush=True)  # fmt: skip

    def done(self) -> None:
        if self.live:
            print(file=self.stream)


def _global_options(parser: argparse.ArgumentParser, after_command: bool = False) -> None:
    """--api, --api-key and --json, before the command or after it. After it they default to
    SUPPRESS: absent there, the value given before the command (or its default) stands."""
    absent: Any = argparse.SUPPRESS if after_command else None
    parser.add_argument("--api", default=absent,
                        help="base URL ending in /v1 (default: $TIMERS_API)")  # fmt: skip
    parser.add_argument("--api-key", default=absent,
                        help="the tenant's key (default: $TIMERS_API_KEY)")  # fmt: skip
    parser.add_argument("--json", action="store_true",
                        default=argparse.SUPPRESS if after_command else False,
                        help="print JSON instead of tables")  # fmt: skip


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line (what is wrong, and where to read more), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="timers",
        description="Second-precision timers that call back to SQS.",
        epilog="Config: --api/--api-key, TIMERS_API/TIMERS_API_KEY, or the running `make run`.",
    )
    _global_options(p)
    after_command = OneLineParser(add_help=False)
    _global_options(after_command, after_command=True)
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, **options: Any) -> argparse.ArgumentParser:
        options.setdefault("description", options.get("help"))  # `timers NAME --help` says it
        return commands.add_parser(name, parents=[after_command], **options)

    create = command("create", help="create a timer")
    _schedule_options(create, required=True)
    _timer_options(create)
    create.add_argument("--idempotency-key")
    create.set_defaults(run=cmd_create)

    update = command(
        "update",
        help="change a timer: the options given (as create takes them), --clear FIELD sets "
        "FIELD to none; the next fire is recomputed",
    )
    update.add_argument("id")
    _schedule_options(update, required=False)
    _timer_options(update)
    update.add_argument("--clear", action="append", choices=CLEARABLE, metavar="FIELD",
                        help=f"clear this field (repeatable): {', '.join(CLEARABLE)}")  # fmt: skip
    update.set_defaults(run=cmd_update, payload=NOT_GIVEN)

    whoami = command("whoami", help="the tenant of the key, and its callback queue")
    whoami.set_defaults(run=cmd_whoami)

    ls = command("ls", help="list timers (every page)")
    ls.add_argument("--status", choices=["active", "paused", "completed"])
    ls.add_argument("--group", metavar="NAME", help="only this group's timers")
    ls.add_argument("--limit", type=whole_number, help="at most this many")
    ls.set_defaults(run=cmd_ls)

    groups = command("groups", help="the tenant's groups (those with a timer in them)")
    groups.set_defaults(run=cmd_groups)
    group = command(
        "group",
        help="pause, resume or delete (rm) every timer of a group: calls until done, a "
        "progress line per call on stderr",
    )
    group.add_argument("group_action", choices=sorted(GROUP_ACTIONS), metavar="pause|resume|rm")
    group.add_argument("name", metavar="NAME")
    group.set_defaults(run=cmd_group)

    for name, run, text in [
        ("get", cmd_get, "show a timer"),
        ("pause", _state_change("pause"), "pause a timer"),
        ("resume", _state_change("resume"), "resume a timer"),
        ("reset", _state_change("reset"), "restart a timer's schedule from now, fire count 0"),
        ("run", cmd_run, "fire a timer once now, besides its schedule (its own fire id)"),
    ]:
        one_timer = command(name, help=text)
        one_timer.add_argument("id")
        one_timer.set_defaults(run=run)

    keys = command("keys", help="the tenant's API keys: ls, create, revoke")
    key_commands = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    keys_ls = key_commands.add_parser("ls", parents=[after_command], help="list the keys")
    keys_ls.set_defaults(run=cmd_keys_ls)
    keys_create = key_commands.add_parser(
        "create", parents=[after_command], help="a new key; its secret is printed this once"
    )
    keys_create.add_argument("--label", help="what the key is for")
    keys_create.set_defaults(run=cmd_keys_create)
    keys_revoke = key_commands.add_parser(
        "revoke", parents=[after_command], help="revoke a key (never the last one)"
    )
    keys_revoke.add_argument("key_id", metavar="KEY_ID")
    keys_revoke.set_defaults(run=cmd_keys_revoke)

    usage = command(
        "usage", help="the tenant's usage in a month (UTC), its fires by lateness (accuracy)"
    )
    usage.add_argument("--month", metavar="YYYY-MM", help="default: this month")
    usage.set_defaults(run=cmd_usage)

    fires = command("fires", help="a timer's fires, newest first")
    fires.add_argument("id")
    fires.add_argument("--limit", type=whole_number)
    fires.set_defaults(run=cmd_fires)

    failed = command("failed", help="the tenant's failed webhook fires, newest first")
    failed.add_argument("--since", metavar="TIME", help="failed at or after this RFC 3339 time")
    failed.add_argument("--until", metavar="TIME", help="failed at or before this RFC 3339 time")
    failed.add_argument("--limit", type=whole_number, help="at most this many")
    failed.add_argument("--all", action="store_true",
                        help="the redelivered ones too (left out by default: failures no more, "
                        "unless they failed again - then listed anew)")  # fmt: skip
    failed.set_defaults(run=cmd_failed)

    redeliver = command(
        "redeliver", help="send a failed fire again (same fire id); no FIRE_ID: all of the timer's"
    )
    redeliver.add_argument("id", metavar="TIMER_ID")
    redeliver.add_argument("fire_id", nargs="?", metavar="FIRE_ID",
                           help="a failed fire's id, or a start of it no other has")  # fmt: skip
    redeliver.set_defaults(run=cmd_redeliver)

    rm = command("rm", help="cancel timers: they never fire again")
    rm.add_argument("ids", nargs="+", metavar="id")
    rm.set_defaults(run=cmd_rm)

    preview = command("preview", help="the next fire times of a schedule")
    _schedule_options(preview, required=True)
    preview.add_argument("--count", type=whole_number)
    preview.set_defaults(run=cmd_preview)

    export = command(
        "export",
        help="every timer as JSON Lines, with its status and fire count (what import "
        "reads); webhook header values are masked: write them in before importing",
    )
    export.add_argument("--status", choices=["active", "paused", "completed"])
    export.add_argument("-o", "--out", type=argparse.FileType("w", encoding="utf-8"),
                        default=sys.stdout, help="where to (default: standard output)")  # fmt: skip
    export.set_defaults(run=cmd_export)

    imp = command(
        "import",
        help="create the timers of a JSON Lines file (- for stdin); completed ones are skipped "
        "and a recurring one gets the fires it has left: nothing that fired fires again",
    )
    imp.add_argument("file", type=argparse.FileType("r", encoding="utf-8"))
    imp.set_defaults(run=cmd_import)

    tail = command("tail", help="print the tenant's callbacks as they arrive")
    tail.add_argument("--count", type=whole_number, help="stop after this many")
    tail.add_argument("--idle", type=duration, help="stop after this long without one")
    tail.set_defaults(run=None)
    return p


def _to_json(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    return value


PIPE_CLOSED = 141
"""The exit code when the reader of standard output went away (``timers ls | head -1``): what
a shell reports for a Unix tool that SIGPIPE ended (128 + 13), so ``set -o pipefail`` scripts
see what they see for ``cat`` or ``grep`` - and never mistake it for an API error (1) or a
usage error (2)."""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = run(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is one more thing caught below
    except BrokenPipeError:
        # Quietly, as Unix tools do. What is still buffered goes nowhere: stdout is pointed at
        # /dev/null, so the interpreter's own flush at exit has nothing to complain about.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return PIPE_CLOSED
    return code


def run(argv: Sequence[str] | None = None) -> int:
    arguments = parser()
    args = arguments.parse_args(argv)
    if getattr(args, "tz", None) is not None and getattr(args, "cron", None) is None:
        print("timers: --tz is the time zone of a --cron schedule; give --cron too",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        config = Config.from_env()
    except ApiConfigError as exc:
        if not args.api:
            print(f"timers: {exc}", file=sys.stderr)
            return 2
        config = Config(args.api, None)
    if args.api:
        config = Config(args.api.rstrip("/"), args.api_key, config.aws_endpoint)
    elif args.api_key:
        config = Config(config.api, args.api_key, config.aws_endpoint)
    try:
        with Client(config.api, config.api_key) as client:
            if args.run is None:
                return cmd_tail(client, args, config)
            result, human, *status = args.run(client, args)
            if result is not None:
                text = json.dumps(_to_json(result), indent=2) if args.json else human()
                if text:
                    print(text)
            if status:
                return int(status[0])
    except ApiError as exc:
        print(error_line(exc, args.json), file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"timers: {exc}", file=sys.stderr)
        return 2
    except httpx.TransportError as exc:  # nothing answers there: say what to do, no traceback
        print(f"timers: {unreachable(config, exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def error_line(exc: ApiError, as_json: bool, timer_id: str | None = None) -> str:
    """An API error as one line of stderr: the contract's error object with --json."""
    if as_json:
        error = {"status": exc.status, "code": exc.code, "message": exc.message,
                 "details": [asdict(d) for d in exc.details]}  # fmt: skip
        return json.dumps({"id": timer_id, "error": error} if timer_id else {"error": error})
    return f"timers: {timer_id}: {exc}" if timer_id else f"timers: {exc}"


def unreachable(config: Config, exc: httpx.TransportError) -> str:
    why = {httpx.ConnectError: "nothing answers there", httpx.TimeoutException: "no answer in time"}
    reason = next((text for kind, text in why.items() if isinstance(exc, kind)), type(exc).__name__)
    return (
        f"cannot reach the API at {config.api} ({reason}). Is the local stack running "
        "(`make run`)? Otherwise set TIMERS_API (or --api) to your deployment's ApiUrl."
    )


if __name__ == "__main__":
    sys.exit(main())
