"""Group operations on a running local stack (``make run``; the ``timers`` command finds it).

``python -m bench.groups delete [N]`` - N (1,000) timers ``every 30 s`` in one group, firing,
then the group deleted through the API, call after call: the time of the calls, and every
callback of those timers checked against the call that deleted its timer (the operation goes
through a group in id order, so each call's ``changed`` says which timers it deleted). A fire
sent after its timer's deleting call answered is counted: ``owed`` if it was due before that
answer (claimed before the change, as the contract allows), ``late`` otherwise (never allowed).

``python -m bench.groups pause [N]`` - N (10,000) timers ``every 3600 s`` in one group, then
``timers group pause`` and ``timers group resume`` through the installed CLI: timers a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import boto3

from timers_client import Client
from timers_client.client import Config, read_state


def _create(client: Client, group: str, count: int, seconds: int) -> list[str]:
    ids: list[str] = []
    bodies = [{"schedule": {"type": "every", "seconds": seconds}, "group": group,
               "payload": {"bench": group}} for _ in range(count)]  # fmt: skip
    for start in range(0, count, 100):
        ids += [t.id for t in client.create_batch(bodies[start : start + 100])]
    return sorted(ids)


def _callbacks(queue_url: str, endpoint: str | None, group: str) -> list[dict[str, Any]]:
    options: dict[str, Any] = {"region_name": "us-east-1"}
    if endpoint:
        options |= {"endpoint_url": endpoint, "aws_access_key_id": "local",
                    "aws_secret_access_key": "local"}  # fmt: skip
    sqs = boto3.client("sqs", **options)
    found: list[dict[str, Any]] = []
    idle = 0
    while idle < 3:
        got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                  WaitTimeSeconds=1).get("Messages", [])  # fmt: skip
        idle = 0 if got else idle + 1
        for message in got:
            body = json.loads(message["Body"])
            if body.get("payload") == {"bench": group}:
                found.append(body)
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return found


def _ms(iso: str) -> int:
    from timers.core.times import parse_ms

    return parse_ms(iso)


def delete(count: int) -> dict[str, Any]:
    config = Config.from_env()
    group = f"bench-del-{uuid4().hex[:6]}"
    with Client(config.api, config.api_key, timeout=60) as client:
        queue = client.tenant().callback_queue_url
        ids = _create(client, group, count, 30)
        time.sleep(40)  # every timer fires at least once
        deleted_by: dict[str, int] = {}  # timer id -> when its deleting call answered (ms)
        calls, started = 0, time.monotonic()
        position = 0
        while True:
            step = client._call("DELETE", f"/groups/{group}")
            answered = int(time.time() * 1000)
            calls += 1
            for timer_id in ids[position : position + step["changed"]]:
                deleted_by[timer_id] = answered
            position += step["changed"]
            if step["done"]:
                break
        took = time.monotonic() - started
        time.sleep(5)
    fires = _callbacks(queue, config.aws_endpoint, group)
    after = [f for f in fires if _ms(f["fired_at"]) > deleted_by.get(f["timer_id"], 1 << 62)]
    owed = [f for f in after if _ms(f["scheduled_at"]) <= deleted_by[f["timer_id"]]]
    return {"timers": count, "deleted": position, "calls": calls, "seconds": round(took, 1),
            "timers_per_second": round(position / took), "fires": len(fires),
            "sent_after_delete_answered": len(after), "of_which_owed": len(owed),
            "late": len(after) - len(owed)}  # fmt: skip


def pause(count: int) -> dict[str, Any]:
    config = Config.from_env()
    group = f"bench-pause-{uuid4().hex[:6]}"
    timers = Path(sys.executable).parent / "timers"
    with Client(config.api, config.api_key, timeout=60) as client:
        started = time.monotonic()
        _create(client, group, count, 3600)
        created = time.monotonic() - started
    result: dict[str, Any] = {"timers": count, "create_seconds": round(created, 1)}
    for action in ("pause", "resume"):
        started = time.monotonic()
        run = subprocess.run([str(timers), "group", action, group], capture_output=True,
                             text=True, check=True, env=os.environ)  # fmt: skip
        took = time.monotonic() - started
        result[action] = {"seconds": round(took, 1), "timers_per_second": round(count / took),
                          "said": run.stdout.strip(),
                          "progress_lines": len(run.stderr.splitlines())}  # fmt: skip
    return result


def main(argv: list[str]) -> None:
    if read_state(dict(os.environ)) is None and not os.environ.get("TIMERS_API"):
        sys.exit("bench.groups: start the stack first (make run)")
    what = argv[0] if argv else "delete"
    count = int(argv[1]) if len(argv) > 1 else (1_000 if what == "delete" else 10_000)
    print(json.dumps((delete if what == "delete" else pause)(count), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
