"""Read callbacks off an SQS queue, checking each against the contract and never-early."""

from __future__ import annotations

import json
from typing import Any

from timers.core.times import parse_ms

BODY_FIELDS = {"fire_id", "timer_id", "tenant", "name", "scheduled_at", "fired_at", "payload"}


def drain(sqs: Any, queue_url: str, now_ms: int | None) -> list[dict[str, Any]]:
    """Every message on the queue (deleted as read). Each must carry the contract's body and
    ``fire_id`` attribute and must not have been sent before its time - nor, on an injected
    clock (``now_ms``), after now. On the wall clock (``None``) a fire may land while we read.
    The message's SQS attributes are kept under ``_attributes``."""
    bodies: list[dict[str, Any]] = []
    while True:
        got = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
        ).get("Messages", [])
        if not got:
            return bodies
        for message in got:
            body = json.loads(message["Body"])
            assert set(body) == BODY_FIELDS
            assert message["MessageAttributes"]["fire_id"] == {
                "DataType": "String",
                "StringValue": body["fire_id"],
            }
            scheduled, fired = parse_ms(body["scheduled_at"]), parse_ms(body["fired_at"])
            assert body["fire_id"] == f"{body['timer_id']}:{scheduled}"
            assert scheduled <= fired, "a callback was sent early"
            assert now_ms is None or fired <= now_ms, "a callback is stamped after now"
            body["_attributes"] = message.get("Attributes", {})
            bodies.append(body)
        sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ],
        )
