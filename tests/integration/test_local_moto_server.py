"""The local stack's moto server (``ops.local.moto_server``): moto's answers, at a lower cost,
refusing what AWS refuses.

Its cost cuts only make moto cheaper; these tests pin that they change no answer: the clock
reads the same time, the retention check keeps and drops the same messages, and the server, run
as the stack runs it, serves SQS (sent timestamps, receive, delete, counts) and DynamoDB as
``python -m moto.server`` does - and enforces ``ops.aws_limits`` (tests/unit/test_aws_limits.py
tries each limit in process; here, that the server has them).
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

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


def limits_table(dynamodb: Any) -> str:
    name = "moto-server-limits"
    if name not in dynamodb.list_tables()["TableNames"]:
        dynamodb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    return name


def refusal(call: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as refused:
        call()
    return refused.value.response["Error"]["Code"], refused.value.response["Error"]["Message"]


def test_the_server_refuses_what_dynamodb_refuses(endpoint: str) -> None:
    dynamodb = client("dynamodb", endpoint)
    table = limits_table(dynamodb)
    key = {"k": {"S": "big"}}
    item = key | {"v": {"S": "x" * 409_595}}  # 409,600 bytes: "k" 1 + 3, "v" 1 + 409,595
    dynamodb.put_item(TableName=table, Item=item)
    assert refusal(lambda: dynamodb.put_item(TableName=table, Item=item | {"w": {"S": ""}})) == (
        "ValidationException",
        "Item size has exceeded the maximum allowed size",
    )
    before = dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
    grow: Any = {"UpdateExpression": "SET n = :n", "ExpressionAttributeValues": {":n": {"N": "1"}}}
    assert refusal(lambda: dynamodb.update_item(TableName=table, Key=key, **grow)) == (
        "ValidationException",
        "Item size to update has exceeded the maximum allowed size",
    )
    assert dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"] == before
    too_long = " AND ".join(f"attribute_not_exists(e{i})" for i in range(136))  # 4,101 bytes
    code, message = refusal(
        lambda: dynamodb.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="REMOVE v",
            ConditionExpression=too_long,
        )
    )
    assert (code, message) == (
        "ValidationException",
        "Invalid ConditionExpression: Expression size has exceeded the maximum allowed size; "
        "expression size: 4101",
    )
    writes: Any = [{"PutRequest": {"Item": {"k": {"S": f"w{i}"}}}} for i in range(26)]
    assert refusal(lambda: dynamodb.batch_write_item(RequestItems={table: writes}))[1] == (
        "Too many items requested for the BatchWriteItem call"
    )


def test_the_server_takes_an_expression_dynamodb_takes(endpoint: str) -> None:
    """287 SET actions are 4,087 bytes: DynamoDB takes them; moto's recursive parser needed
    more than Python's default 1,000 frames (it answered 500)."""
    dynamodb = client("dynamodb", endpoint)
    table = limits_table(dynamodb)
    dynamodb.update_item(
        TableName=table,
        Key={"k": {"S": "wide"}},
        UpdateExpression="SET " + ", ".join(f"#e{i} = :v{i}" for i in range(287)),
        ExpressionAttributeNames={f"#e{i}": f"e{i}" for i in range(287)},
        ExpressionAttributeValues={f":v{i}": {"N": str(i)} for i in range(287)},
    )
    item = dynamodb.get_item(TableName=table, Key={"k": {"S": "wide"}})["Item"]
    assert len(item) == 288


def test_the_server_refuses_what_sqs_refuses(endpoint: str) -> None:
    sqs = client("sqs", endpoint)
    attributes = {"MaximumMessageSize": "262144"}  # a queue made before SQS's 1 MiB
    url = sqs.create_queue(QueueName="moto-server-limits", Attributes=attributes)["QueueUrl"]
    fire_id: Any = {"fire_id": {"DataType": "String", "StringValue": "t:1"}}  # 16 bytes
    sqs.send_message(QueueUrl=url, MessageBody="x" * 262_128, MessageAttributes=fire_id)
    code, message = refusal(
        lambda: sqs.send_message(QueueUrl=url, MessageBody="x" * 262_129, MessageAttributes=fire_id)
    )
    assert code == "InvalidParameterValue"
    assert "Message must be shorter than 262144 bytes" in message
    sqs.purge_queue(QueueUrl=url)


def test_a_delete_never_drops_a_message_sent_at_the_same_instant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """moto's DeleteMessage rebuilds the queue's list: a send landing between the rebuild's loop
    and its write was dropped (accepted by SendMessage, never received). The server's delete
    holds the queue's lock, so the send waits for it and its message stays."""
    from moto import mock_aws
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sqs.models import Queue, sqs_backends

    monkeypatch.setattr(Queue, "delete_message", Queue.delete_message)  # restored after
    moto_server.atomic_sqs_delete()
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="race")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="first")
        handle = sqs.receive_message(QueueUrl=url)["Messages"][0]["ReceiptHandle"]
        sender = threading.Thread(target=sqs.send_message, kwargs={
            "QueueUrl": url, "MessageBody": "sent while the first is deleted"})  # fmt: skip

        class RebuildEndsWithASend(list[Any]):
            def __iter__(self) -> Iterator[Any]:
                yield from list.__iter__(self)
                if not sender.is_alive() and sender.ident is None:  # the first loop run out
                    sender.start()
                    sender.join(0.5)  # it lands now, unless the delete holds the lock

        queue = sqs_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].queues["race"]
        queue._messages = RebuildEndsWithASend(queue._messages)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
        sender.join(10)
        bodies = [m["Body"] for m in sqs.receive_message(QueueUrl=url).get("Messages", [])]
    assert sender.ident is not None
    assert bodies == ["sent while the first is deleted"]


def test_a_transaction_is_all_or_nothing_without_copying_the_tables(endpoint: str) -> None:
    """The server's transactions keep only the items they name as their backup: a failed one
    leaves every item as it was (those it changed before the failing action too), a good one
    applies; many at once from threads (the group operations' changes) all land."""
    from concurrent.futures import ThreadPoolExecutor

    from botocore.exceptions import ClientError

    dynamodb = client("dynamodb", endpoint)
    dynamodb.create_table(
        TableName="moto-tx-test",
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    put = lambda k, v: {"Put": {"TableName": "moto-tx-test",  # noqa: E731
                                "Item": {"k": {"S": k}, "v": {"N": str(v)}}}}  # fmt: skip
    dynamodb.transact_write_items(TransactItems=[put("a", 1), put("b", 1)])
    failing = {"ConditionCheck": {"TableName": "moto-tx-test", "Key": {"k": {"S": "b"}},
               "ConditionExpression": "v = :two",
               "ExpressionAttributeValues": {":two": {"N": "2"}}}}  # fmt: skip
    with pytest.raises(ClientError, match="TransactionCanceled"):
        dynamodb.transact_write_items(TransactItems=[put("a", 5), put("new", 5), failing])
    items = dynamodb.scan(TableName="moto-tx-test")["Items"]
    assert sorted((i["k"]["S"], i["v"]["N"]) for i in items) == [("a", "1"), ("b", "1")]

    def bump(n: int) -> None:
        dynamodb.transact_write_items(TransactItems=[put(f"t{n}", n), put(f"u{n}", n)])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(bump, range(64)))
    assert dynamodb.scan(TableName="moto-tx-test", Select="COUNT")["Count"] == 2 + 128
