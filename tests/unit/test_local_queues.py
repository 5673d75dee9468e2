"""The local stack's SQS event sources: read from template.yaml, settled as Lambda settles them."""

from __future__ import annotations

import json

from ops.local.lambdas import Outcome
from ops.local.queues import settled, sqs_event
from ops.local.spec import load_stack

IDS = ["m1", "m2", "m3"]
LOCAL = {"REDIS_URL": "redis://127.0.0.1:6390/0", "REDIS_CLUSTER": "false"}


def test_the_delivery_queue_is_an_event_source_of_the_delivery_function() -> None:
    spec = load_stack(LOCAL, aws_endpoint="http://127.0.0.1:4566")
    source, redriven = spec.queue_sources
    assert source.function == "DeliveryFunction"
    assert source.queue_url == "http://127.0.0.1:4566/123456789012/DeliveryQueue"
    assert source.queue_arn.endswith(":DeliveryQueue")
    assert (source.batch_size, source.window_s, source.report_failures) == (10, 0, True)
    assert source.max_concurrency == 50
    env = spec.functions["TriggerFunction"].environment
    assert env["DELIVERY_QUEUE_URL"] == source.queue_url
    assert "TIMERS_ALLOW_LOOPBACK_TARGETS" not in env
    # What SQS moves off the delivery queue is settled by the same function, as locally.
    assert (redriven.function, redriven.name) == ("DeliveryFunction", "DeliveryFunction.Redriven")
    assert redriven.queue_arn.endswith(":DeliveryRedriveQueue") and redriven.report_failures
    env = spec.functions["DeliveryFunction"].environment
    assert env["DELIVERY_REDRIVE_QUEUE_URL"] == redriven.queue_url


def test_partial_batch_failures_keep_only_the_failed_messages() -> None:
    answer = {"batchItemFailures": [{"itemIdentifier": "m2"}]}
    assert settled(Outcome(json.dumps(answer).encode()), IDS, True) == ["m1", "m3"]
    assert settled(Outcome(b'{"batchItemFailures": []}'), IDS, True) == IDS
    assert settled(Outcome(b"null"), IDS, True) == IDS  # no answer: every message succeeded


def test_a_failed_invocation_or_a_bad_answer_keeps_the_whole_batch() -> None:
    assert settled(Outcome.failed("Boom", "x"), IDS, True) == []
    assert settled(Outcome(b'{"batchItemFailures": "m2"}'), IDS, True) == []
    assert settled(Outcome(b'{"batchItemFailures": [{"itemIdentifier": ""}]}'), IDS, True) == []
    # without ReportBatchItemFailures the answer is not read: success deletes all
    answer = {"batchItemFailures": [{"itemIdentifier": "m2"}]}
    assert settled(Outcome(json.dumps(answer).encode()), IDS, False) == IDS


def test_the_event_is_the_one_lambda_builds() -> None:
    spec = load_stack(LOCAL)
    message = {
        "MessageId": "m1",
        "ReceiptHandle": "rh",
        "Body": "{}",
        "Attributes": {"ApproximateReceiveCount": "1"},
        "MessageAttributes": {"fire_id": {"DataType": "String", "StringValue": "t:1"}},
    }
    (record,) = sqs_event([message], spec.queue_sources[0], "us-east-1")["Records"]
    assert record["eventSource"] == "aws:sqs" and record["messageId"] == "m1"
    assert record["messageAttributes"]["fire_id"]["stringValue"] == "t:1"
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
