"""A handler for the local stack's sandbox tests: ``event["do"]`` picks how it behaves."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def handler(event: dict[str, Any], context: Any) -> Any:
    do = event.get("do", "echo")
    if do == "hang":
        time.sleep(3600)
    if do == "fail":
        raise ValueError(f"bad event {event!r}")
    if do == "exit":
        os._exit(3)
    if do == "not_json":
        return object()
    if do == "print":  # print() as handlers' loggers do: the text, then its newline
        for n in range(event["lines"]):
            print(json.dumps({"pid": os.getpid(), "n": n, "pad": "x" * 200}))
    if do == "fail_once":  # fails the first time, then records the event it got
        marker = Path(event["path"])
        if not marker.with_suffix(".tried").exists():
            marker.with_suffix(".tried").touch()
            raise RuntimeError("first attempt fails")
        marker.write_text(str(event["value"]))
    return {
        "event": event,
        "request_id": context.aws_request_id,
        "function": context.function_name,
        "remaining_ms": context.get_remaining_time_in_millis(),
        "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ("GREETING", "AWS_LAMBDA_FUNCTION_NAME", "LEAK")},
    }
