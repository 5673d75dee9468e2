"""The local stack's moto server (``ops.local.moto_server``): moto's answers, at a lower cost.

Its two changes only make moto's SQS cheaper; these tests pin that they change no answer: the
clock reads the same time, the retention check keeps and drops the same messages, and the
server, run as the stack runs it, serves SQS (sent timestamps, receive, delete, counts) and
DynamoDB as ``python -m moto.server`` does.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from ops.local import moto_server
from ops.ports import free_port


def test_the_clock_reads_the_time_moto_reads() -> None:
    before = moto_server._moto_unix_time(None)
    ours = moto_server.unix_time()
    after = moto_server._moto_unix_time(None)
    assert before - 0.001 <= ours <= after + 0.001
    dt = datetime.datetime(2026, 3, 29, 1, 59, 59, 250_000)
    assert moto_server.unix_time(dt) == moto_server._moto_unix_time(dt)


@pytest.mark.parametrize(
    ("age_s", "kept"), [(0, True), (59, True), (61, False), (4 * 86_400 + 1, False)]
)
def test_the_retention_check_keeps_what_moto_keeps(age_s: int, kept: bool) -> None:
    retention_s = 60 if age_s < 86_400 else 4 * 86_400
    queue = SimpleNamespace(message_retention_period=retention_s)
    backend = SimpleNamespace(get_queue=lambda name: queue)
    message = SimpleNamespace(sent_timestamp=(time.time() - age_s) * 1000)
    assert moto_server._retained(backend, "q", message) is kept


def client(service: Any, endpoint: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.local.moto_server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        sqs = client("sqs", url)
        deadline = time.monotonic() + 60
        while True:
            try:
                sqs.list_queues()
                break
            except Exception:
                assert process.poll() is None, "the moto server exited at start"
                assert time.monotonic() < deadline, "the moto server did not answer"
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def test_the_server_serves_sqs_as_moto_does(endpoint: str) -> None:
    sqs = client("sqs", endpoint)
    url = sqs.create_queue(QueueName="moto-server-test")["QueueUrl"]
    start_ms = int(time.time() * 1000)
    for batch in range(3):
        entries: Any = [{"Id": str(i), "MessageBody": f"{batch}-{i}"} for i in range(10)]
        assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 10
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert counts["ApproximateNumberOfMessages"] == "30"
    got: list[dict[str, Any]] = []
    while len(got) < 30:
        batch_got = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageSystemAttributeNames=["SentTimestamp"],
        ).get("Messages", [])
        assert batch_got, f"only {len(got)} of 30 received"
        got += batch_got
    assert sorted(m["Body"] for m in got) == sorted(f"{b}-{i}" for b in range(3) for i in range(10))
    for m in got:
        assert start_ms - 1_000 <= int(m["Attributes"]["SentTimestamp"]) <= time.time() * 1000
    counts = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    assert counts == {"ApproximateNumberOfMessagesNotVisible": "30"}
    for start in range(0, 30, 10):
        handles: Any = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
            for i, m in enumerate(got[start : start + 10])
        ]
        assert len(sqs.delete_message_batch(QueueUrl=url, Entries=handles)["Successful"]) == 10
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert counts["ApproximateNumberOfMessages"] == "0"
    assert counts["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_the_server_serves_dynamodb(endpoint: str) -> None:
    dynamodb = client("dynamodb", endpoint)
    dynamodb.create_table(
        TableName="moto-server-test",
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.put_item(TableName="moto-server-test", Item={"k": {"S": "a"}, "n": {"N": "1"}})
    item = dynamodb.get_item(TableName="moto-server-test", Key={"k": {"S": "a"}})["Item"]
    assert item == {"k": {"S": "a"}, "n": {"N": "1"}}


@pytest.mark.parametrize("clause", ["SET", "REMOVE", "ADD"])
def test_an_update_with_a_clause_twice_is_refused_as_moto_refuses_it(
    endpoint: str, clause: str
) -> None:
    dynamodb = client("dynamodb", endpoint)
    actions = {"SET": ("a = :v", "b = :v"), "REMOVE": ("a", "b"), "ADD": ("n :n", "m :n")}[clause]
    values = {"SET": {":v": {"S": "1"}}, "ADD": {":n": {"N": "1"}}}.get(clause)
    with pytest.raises(dynamodb.exceptions.ClientError, match=f'The "{clause}" section can only'):
        dynamodb.update_item(
            TableName="moto-server-test",
            Key={"k": {"S": "twice"}},
            UpdateExpression=f"{clause} {actions[0]} {clause} {actions[1]}",
            **({"ExpressionAttributeValues": values} if values else {}),
        )


def test_an_update_with_many_actions_applies(endpoint: str) -> None:
    dynamodb = client("dynamodb", endpoint)
    names = {f"#e{i}": f"entry{i}" for i in range(50)}
    values = {f":v{i}": {"N": str(i)} for i in range(50)}
    dynamodb.update_item(
        TableName="moto-server-test",
        Key={"k": {"S": "many"}},
        UpdateExpression="SET " + ", ".join(f"#e{i} = :v{i}" for i in range(50)) + " ADD c :one",
        ConditionExpression=" AND ".join(f"attribute_not_exists(#e{i})" for i in range(50)),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues={**values, ":one": {"N": "1"}},
    )
    item = dynamodb.get_item(TableName="moto-server-test", Key={"k": {"S": "many"}})["Item"]
    assert item == {
        "k": {"S": "many"},
        "c": {"N": "1"},
        **{f"entry{i}": {"N": str(i)} for i in range(50)},
    }
