"""``timers``: the timer service from a shell, on the SDK.

    timers create --in 30s --payload '{"a":1}'
    timers create --cron '0 7 * * 1-5' --tz Europe/Berlin --name standup
    timers ls | timers get ID | timers fires ID | timers pause|resume|rm ID
    timers preview --every 90s --count 5
    timers failed --since 2026-11-21T00:00:00Z     # webhook fires whose delivery gave up
    timers redeliver ID [FIRE_ID]    # one failed fire again, or every failed fire of ID
    timers tail                      # the tenant's callbacks as they arrive, with their lag
    timers export > timers.jsonl     # every timer, one JSON object per line
    timers import timers.jsonl       # create them (100 per request), report what failed

Configuration: ``--api``/``--api-key``, else ``TIMERS_API``/``TIMERS_API_KEY``, else the running
``make run`` (its state file: its API and the demo tenant's key). Tables for people by default;
``--json`` prints the API's JSON (one object per line for ``tail``) for scripts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from timers_client import bulk
from timers_client.client import ApiConfigError, Client, Config, after, at, cron, every
from timers_client.errors import ApiError

_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def duration(text: str) -> float:
    """Seconds of ``30``, ``30s``, ``1.5s``, ``250ms``, ``5m``, ``1h30m``, ``2d``."""
    text = text.strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 5m, 1h30m)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


# ---------------------------------------------------------------- output


def _short(value: Any, width: int = 40) -> str:
    text = "-" if value is None else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def schedule_text(schedule: dict[str, Any]) -> str:
    kind = schedule.get("type")
    if kind == "at":
        return f"at {schedule['at']}"
    if kind in ("after", "every"):
        return f"{kind} {schedule['seconds']:g}s"
    if kind == "cron":
        return f"cron '{schedule['expression']}' {schedule.get('timezone', 'UTC')}"
    return json.dumps(schedule)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [list(headers)] + [[_short(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def timer_rows(timers: Iterable[Any]) -> list[list[Any]]:
    return [
        [t.id, t.status, schedule_text(t.schedule), t.next_fire_at, t.fire_count, t.name]
        for t in timers
    ]


TIMER_HEADERS = ("ID", "STATUS", "SCHEDULE", "NEXT FIRE", "FIRES", "NAME")


def show_timer(timer: Any) -> str:
    data = asdict(timer)
    data["schedule"] = schedule_text(timer.schedule)
    data["target"] = timer.target.get("queue_url") or timer.target.get("url")
    data["payload"] = json.dumps(timer.payload)
    width = max(len(k) for k in data)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in data.items())


# ---------------------------------------------------------------- commands


def _schedule(args: argparse.Namespace) -> dict[str, Any]:
    if args.in_ is not None:
        return after(args.in_)
    if args.at is not None:
        return at(args.at)
    if args.every is not None:
        return every(args.every)
    return cron(args.cron, args.tz)


def header_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError("expected 'Name: value'")
    return name.strip(), value.strip()


def cmd_create(client: Client, args: argparse.Namespace) -> Any:
    target = {"queue_url": args.queue_url} if args.queue_url else None
    if args.url:
        target = {"url": args.url, **({"headers": dict(args.header)} if args.header else {})}
    timer = client.create(
        _schedule(args), name=args.name, start_at=args.start, end_at=args.end,
        max_fires=args.max_fires, target=target, payload=args.payload, misfire=args.misfire,
        idempotency_key=args.idempotency_key,
    )  # fmt: skip
    return timer, lambda: show_timer(timer)


def cmd_whoami(client: Client, args: argparse.Namespace) -> Any:
    tenant = client.tenant()
    return tenant, lambda: table(("TENANT", "CALLBACK QUEUE", "RETENTION DAYS"),
                                 [[tenant.tenant, tenant.callback_queue_url,
                                   tenant.retention_days]])  # fmt: skip


def cmd_ls(client: Client, args: argparse.Namespace) -> Any:
    timers = list(client.list(status=args.status))
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
    rows = [[f.fire_id, f.scheduled_at, f.enqueued_at, f.lag_ms, f.status, f.reason]
            for f in fires]  # fmt: skip
    headers = ("FIRE ID", "SCHEDULED", "ENQUEUED", "LAG MS", "STATUS", "REASON")
    return {"items": fires}, lambda: table(headers, rows)


FAILED_HEADERS = ("FAILED AT", "FIRE ID", "REASON", "LAST STATUS")


def failed_rows(fires: Iterable[Any]) -> list[list[Any]]:
    return [[f.failed_at, f.fire_id, f.reason, f.last_status] for f in fires]


def cmd_failed(client: Client, args: argparse.Namespace) -> Any:
    fires = []
    for fire in client.failed_fires(since=args.since, until=args.until):
        fires.append(fire)
        if args.limit is not None and len(fires) >= args.limit:
            break
    return {"items": fires}, lambda: table(FAILED_HEADERS, failed_rows(fires))


def cmd_redeliver(client: Client, args: argparse.Namespace) -> Any:
    if args.fire_id is not None:
        fires = [client.redeliver(args.id, args.fire_id)]
    else:
        fires = client.redeliver_all(args.id)
    text = "\n".join(f"redelivered {f.fire_id}" for f in fires) or "(no failed fire to redeliver)"
    return {"items": fires}, lambda: text


def _state_change(name: str) -> Callable[[Client, argparse.Namespace], Any]:
    def run(client: Client, args: argparse.Namespace) -> Any:
        timer = getattr(client, name)(args.id)
        return timer, lambda: table(TIMER_HEADERS, timer_rows([timer]))

    return run


def cmd_rm(client: Client, args: argparse.Namespace) -> Any:
    for timer_id in args.ids:
        client.delete(timer_id)
    return {"deleted": args.ids}, lambda: "\n".join(f"deleted {i}" for i in args.ids)


def cmd_preview(client: Client, args: argparse.Namespace) -> Any:
    preview = client.preview(
        _schedule(args), start_at=args.start, end_at=args.end, max_fires=args.max_fires,
        count=args.count,
    )  # fmt: skip
    return preview, lambda: "\n".join(preview.fire_times) or "(no fire)"


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
    while args.count is None or seen < args.count:
        if args.idle is not None and time.monotonic() - idle_since > args.idle:
            break
        wait = 1 if args.idle is not None else 10
        got = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait,
            MessageAttributeNames=["All"],
        ).get("Messages", [])  # fmt: skip
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
    parser.add_argument("--tz", default="UTC", help="IANA time zone of --cron (default UTC)")
    parser.add_argument("--start", metavar="TIME", help="no fire before this RFC 3339 time")
    parser.add_argument("--end", metavar="TIME", help="no fire after this RFC 3339 time")
    parser.add_argument("--max-fires", type=int, metavar="N")


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
        "failed": [{"line": number, "reason": why} for number, why in failed],
    }  # fmt: skip

    def human() -> str:
        head = f"imported {len(report.created)} of {report.total} timers"
        if not failed:
            return head
        return "\n".join([f"{head}; {len(failed)} failed:",
                          *(f"  line {n}: {why}" for n, why in failed)])  # fmt: skip

    return result, human, 1 if failed else 0


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


def _json_here_too(command: argparse.ArgumentParser) -> None:
    """``--json`` after the command as well as before it (SUPPRESS: absent, the one before
    it stands)."""
    command.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                         help="print JSON instead of a table")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="timers",
        description="Second-precision timers that call back to SQS.",
        epilog="Config: --api/--api-key, TIMERS_API/TIMERS_API_KEY, or the running `make run`.",
    )
    p.add_argument("--api", help="base URL ending in /v1 (default: $TIMERS_API)")
    p.add_argument("--api-key", help="the tenant's key (default: $TIMERS_API_KEY)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    create = sub.add_parser("create", help="create a timer")
    _schedule_options(create, required=True)
    create.add_argument("--name")
    create.add_argument("--payload", type=json_value, help="any JSON value, delivered verbatim")
    create.add_argument("--misfire", choices=["fire_once", "fire_all", "skip"])
    where = create.add_mutually_exclusive_group()
    where.add_argument("--queue-url", help="target queue (default: the tenant's)")
    where.add_argument("--url", help="HTTP target: POST there, signed (Standard Webhooks)")
    create.add_argument("--header", type=header_value, action="append",
                        help="with --url: 'Name: value', repeatable")  # fmt: skip
    create.add_argument("--idempotency-key")
    create.set_defaults(run=cmd_create)

    whoami = sub.add_parser("whoami", help="the tenant of the key, and its callback queue")
    whoami.set_defaults(run=cmd_whoami)

    ls = sub.add_parser("ls", help="list timers (every page)")
    ls.add_argument("--status", choices=["active", "paused", "completed"])
    ls.add_argument("--limit", type=int, help="at most this many")
    ls.set_defaults(run=cmd_ls)

    for name, run, text in [
        ("get", cmd_get, "show a timer"),
        ("pause", _state_change("pause"), "pause a timer"),
        ("resume", _state_change("resume"), "resume a timer"),
    ]:
        command = sub.add_parser(name, help=text)
        command.add_argument("id")
        command.set_defaults(run=run)

    fires = sub.add_parser("fires", help="a timer's fires, newest first")
    fires.add_argument("id")
    fires.add_argument("--limit", type=int)
    fires.set_defaults(run=cmd_fires)

    failed = sub.add_parser("failed", help="the tenant's failed webhook fires, newest first")
    failed.add_argument("--since", metavar="TIME", help="failed at or after this RFC 3339 time")
    failed.add_argument("--until", metavar="TIME", help="failed at or before this RFC 3339 time")
    failed.add_argument("--limit", type=int, help="at most this many")
    _json_here_too(failed)
    failed.set_defaults(run=cmd_failed)

    redeliver = sub.add_parser(
        "redeliver", help="send a failed fire again (same fire id); no FIRE_ID: all of the timer's"
    )
    redeliver.add_argument("id", metavar="TIMER_ID")
    redeliver.add_argument("fire_id", nargs="?", metavar="FIRE_ID")
    _json_here_too(redeliver)
    redeliver.set_defaults(run=cmd_redeliver)

    rm = sub.add_parser("rm", help="cancel timers: they never fire again")
    rm.add_argument("ids", nargs="+", metavar="id")
    rm.set_defaults(run=cmd_rm)

    preview = sub.add_parser("preview", help="the next fire times of a schedule")
    _schedule_options(preview, required=True)
    preview.add_argument("--count", type=int)
    preview.set_defaults(run=cmd_preview)

    export = sub.add_parser("export", help="every timer as JSON Lines (what import reads)")
    export.add_argument("--status", choices=["active", "paused", "completed"])
    export.add_argument("-o", "--out", type=argparse.FileType("w", encoding="utf-8"),
                        default=sys.stdout, help="where to (default: standard output)")  # fmt: skip
    export.set_defaults(run=cmd_export)

    imp = sub.add_parser("import", help="create the timers of a JSON Lines file (- for stdin)")
    imp.add_argument("file", type=argparse.FileType("r", encoding="utf-8"))
    imp.set_defaults(run=cmd_import)

    tail = sub.add_parser("tail", help="print the tenant's callbacks as they arrive")
    tail.add_argument("--count", type=int, help="stop after this many")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
                print(json.dumps(_to_json(result), indent=2) if args.json else human())
            if status:
                return int(status[0])
    except ApiError as exc:
        if args.json:
            print(json.dumps({"error": {"status": exc.status, "code": exc.code,
                   "message": exc.message, "details": [asdict(d) for d in exc.details]}}),
                  file=sys.stderr)  # fmt: skip
        else:
            print(f"timers: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
