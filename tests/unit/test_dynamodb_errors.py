"""Telling DynamoDB's answers from transport failures in pynamodb's errors."""

from __future__ import annotations

from botocore.exceptions import ClientError, ReadTimeoutError
from pynamodb.exceptions import PutError

from timers.store.dynamodb import failed_because


def test_a_condition_failure_is_told_from_a_timeout() -> None:
    refused = ClientError({"Error": {"Code": "ConditionalCheckFailedException"}}, "PutItem")
    assert failed_because(PutError("no", refused), "ConditionalCheckFailedException")
    # botocore leaves a timeout's response None: pynamodb's cause_response_code raises there
    timeout = ReadTimeoutError(endpoint_url="https://dynamodb")
    assert not failed_because(PutError("slow", timeout), "ConditionalCheckFailedException")
    assert not failed_because(PutError("bare"), "ConditionalCheckFailedException")
