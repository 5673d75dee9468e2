"""ops.aws_limits: moto refuses what DynamoDB and SQS refuse, and accepts what they accept.

Each limit is tried just under and just over it (the numbers measured against DynamoDB Local
are in the module's docstring); the item sizes are DynamoDB Local's, type by type.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from ops.aws_limits import FairLock, aws_limits, item_bytes, tables_locked, tables_of, value_bytes
from ops.local.moto_server import DEEP_EXPRESSION_FRAMES

BIG = 409_580  # DynamoDB Local's probe: items {"k": "bNN", "v": BIG characters} of 409,585 bytes


@pytest.fixture
def ddb() -> Iterator[Any]:
    with mock_aws(), aws_limits():
        client = boto3.client("dynamodb", region_name="us-east-1")
        for name, keys in (("tbl", ["k"]), ("tbr", ["k", "r"])):
            client.create_table(
                TableName=name,
                KeySchema=[
                    {"AttributeName": k, "KeyType": t}
                    for k, t in zip(keys, ["HASH", "RANGE"], strict=False)
                ],
                AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in keys],
                BillingMode="PAY_PER_REQUEST",
            )
        client.put_item(TableName="tbl", Item={"k": {"S": "a"}})
        yield client


@pytest.fixture
def deep_frames() -> Iterator[None]:
    """moto parses 300 update actions in more than Python's default 1,000 frames (the local
    stack's moto server raises its limit; the tests' process keeps the default elsewhere)."""
    default = sys.getrecursionlimit()
    sys.setrecursionlimit(DEEP_EXPRESSION_FRAMES)
    yield
    sys.setrecursionlimit(default)


@pytest.fixture
def sqs() -> Iterator[Any]:
    with mock_aws(), aws_limits():
        yield boto3.client("sqs", region_name="us-east-1")


def S(n: int, c: str = "x") -> dict[str, str]:
    return {"S": c * n}


V = {":v": {"N": "1"}}


def put(client: Any, **item: Any) -> Any:
    return client.put_item(TableName="tbl", Item={"k": {"S": "p"}, **item})


def update(client: Any, expression: str, condition: str | None = None, **kw: Any) -> Any:
    kw.setdefault("ExpressionAttributeValues", V)
    if condition:
        kw["ConditionExpression"] = condition
    return client.update_item(
        TableName="tbl", Key={"k": {"S": "a"}}, UpdateExpression=expression, **kw
    )


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = S(1)
    for _ in range(levels):
        value = {"M": {"a": value}}
    return value


def record_style(client: Any, n: int) -> Any:
    """The claim store's record: per entry ``#eN.#o = :own AND #eN.#r = :rN`` (4N - 1)."""
    names = {f"#e{i}": f"e{i}" for i in range(n)} | {"#o": "o", "#r": "r"}
    values = {":own": S(1), ":v": S(1)} | {f":r{i}": {"N": "1"} for i in range(n)}
    return update(
        client,
        "SET " + ", ".join(f"#e{i} = :v" for i in range(n)),
        " AND ".join(f"#e{i}.#o = :own AND #e{i}.#r = :r{i}" for i in range(n)),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
    )


def padded(expression: str, n: int) -> str:
    return expression + " " * (n - len(expression))


def transact_payload(client: Any, extra: int) -> Any:
    """Ten puts of 409,585 bytes and an update of a value of ``extra`` bytes (+ 14: its key
    and its expression): DynamoDB Local's 4 MiB payload is reached at extra = 98,440."""
    puts = [
        {"Put": {"TableName": "tbl", "Item": {"k": {"S": f"b{i:02d}"}, "v": S(BIG)}}}
        for i in range(10)
    ]
    change = {
        "TableName": "tbl",
        "Key": {"k": {"S": "b10"}},
        "UpdateExpression": "SET v = :v",
        "ExpressionAttributeValues": {":v": S(extra)},
    }
    return client.transact_write_items(TransactItems=[*puts, {"Update": change}])


Call = Callable[[Any, int], Any]
DYNAMODB_LIMITS: list[tuple[str, Call, int, str]] = [
    # (what, call(client, n), the largest n accepted, the message of n + 1)
    ("item size", lambda c, n: put(c, v=S(n - 3)), 409_600, "Item size has exceeded"),
    (
        "item size, batch write",
        lambda c, n: c.batch_write_item(
            RequestItems={"tbl": [{"PutRequest": {"Item": {"k": S(1), "v": S(n - 3)}}}]}
        ),
        409_600,
        "Item size has exceeded",
    ),
    (
        "item size, transaction",
        lambda c, n: c.transact_write_items(
            TransactItems=[{"Put": {"TableName": "tbl", "Item": {"k": S(1), "v": S(n - 3)}}}]
        ),
        409_600,
        "Item size has exceeded",
    ),
    ("nesting", lambda c, n: put(c, m=nested(n)), 31, "Nesting Levels have exceeded"),
    (
        "partition key, put",
        lambda c, n: c.put_item(TableName="tbl", Item={"k": S(n)}),
        2048,
        "hashkey",
    ),
    (
        "partition key, multibyte",
        lambda c, n: c.put_item(TableName="tbl", Item={"k": {"S": "é" * (n // 2) + "x" * (n % 2)}}),
        2048,
        "hashkey",
    ),
    (
        "partition key, get",
        lambda c, n: c.get_item(TableName="tbl", Key={"k": S(n)}),
        2048,
        "hashkey",
    ),
    (
        "partition key, delete",
        lambda c, n: c.delete_item(TableName="tbl", Key={"k": S(n)}),
        2048,
        "hashkey",
    ),
    (
        "sort key, get",
        lambda c, n: c.get_item(TableName="tbr", Key={"k": S(1), "r": S(n)}),
        1024,
        "range keys",
    ),
    (
        "condition length",
        lambda c, n: update(c, "SET z = :v", padded("attribute_exists(k)", n)),
        4096,
        "Invalid ConditionExpression: Expression size has exceeded the maximum allowed size; "
        "expression size: 4097",
    ),
    (
        "update length",
        lambda c, n: update(c, padded("SET z = :v", n)),
        4096,
        "Invalid UpdateExpression: Expression size has exceeded",
    ),
    (
        "projection length",
        lambda c, n: c.get_item(
            TableName="tbl", Key={"k": S(1, "a")}, ProjectionExpression=padded("k", n)
        ),
        4096,
        "Invalid ProjectionExpression: Expression size has exceeded",
    ),
    (
        "key condition length",
        lambda c, n: c.query(
            TableName="tbl",
            KeyConditionExpression=padded("k = :k", n),
            ExpressionAttributeValues={":k": S(1)},
        ),
        4096,
        "Invalid KeyConditionExpression: Expression size has exceeded",
    ),
    (
        "filter length",
        lambda c, n: c.scan(TableName="tbl", FilterExpression=padded("attribute_exists(z)", n)),
        4096,
        "Invalid FilterExpression: Expression size has exceeded",
    ),
    (
        "batch get projection length",
        lambda c, n: c.batch_get_item(
            RequestItems={
                "tbl": {"Keys": [{"k": S(1, "a")}], "ProjectionExpression": padded("k", n)}
            }
        ),
        4096,
        "Invalid ProjectionExpression: Expression size has exceeded",
    ),
    (
        "attribute_not_exists(eN) AND ...: 4 KB first",
        lambda c, n: update(
            c, "SET z = :v", " AND ".join(f"attribute_not_exists(e{i})" for i in range(n))
        ),
        135,
        "expression size: 4101",
    ),
    ("record-style condition: 4N - 1 operators", record_style, 75, "operator count: 301"),
    (
        "comparisons and ANDs",
        lambda c, n: update(c, "SET z = :v", " AND ".join(f"e{i} = :v" for i in range(n))),
        150,
        "Invalid ConditionExpression: The expression contains too many operators; "
        "operator count: 301",
    ),
    (
        "NOT and functions",
        lambda c, n: update(
            c, "SET z = :v", " AND ".join(f"NOT attribute_exists(e{i})" for i in range(n))
        ),
        100,
        "too many operators",
    ),
    (
        "BETWEEN counts once",
        lambda c, n: update(
            c, "SET z = :v", " AND ".join(f"e{i} BETWEEN :v AND :v" for i in range(n))
        ),
        150,
        "too many operators",
    ),
    (
        "+ in an update; SET's = is no operator",
        lambda c, n: update(c, "SET " + ",".join(f"a{i}=:v+:v" for i in range(n))),
        300,
        "Invalid UpdateExpression: The expression contains too many operators",
    ),
    (
        "functions in an update",
        lambda c, n: update(
            c,
            "SET "
            + ",".join(f"a{i}=if_not_exists(b,:v)" for i in range(50))
            + ","
            + ",".join(f"c{j}=:v+:v" for j in range(n - 50)),
        ),
        300,
        "too many operators",
    ),
    (
        "filter operators",
        lambda c, n: c.scan(
            TableName="tbl",
            FilterExpression=" AND ".join(f"a{i} = :v" for i in range(n)),
            ExpressionAttributeValues=V,
        ),
        150,
        "Invalid FilterExpression: The expression contains too many operators",
    ),
    (
        "IN operands",
        lambda c, n: update(c, "SET z = :v", "z IN (" + ",".join([":v"] * n) + ")"),
        100,
        "The IN operator is provided with too many operands; number of operands: 101",
    ),
    (
        "name placeholder",
        lambda c, n: c.get_item(
            TableName="tbl",
            Key={"k": S(1, "a")},
            ProjectionExpression="#" + "a" * (n - 1),
            ExpressionAttributeNames={"#" + "a" * (n - 1): "k"},
        ),
        255,
        "a key that is too long; size of key: 256",
    ),
    (
        "value placeholder",
        lambda c, n: update(
            c, "SET z = :" + "a" * (n - 1), ExpressionAttributeValues={":" + "a" * (n - 1): S(1)}
        ),
        255,
        "ExpressionAttributeValues contains invalid key",
    ),
    (
        "an expression with its values: 1 MiB",
        lambda c, n: update(
            c, "SET z = :v", "b <> :a0", ExpressionAttributeValues=V | {":a0": S(n)}
        ),
        1_048_568,
        "Invalid ConditionExpression: Expression size has exceeded the maximum allowed size;",
    ),
    (
        "transaction actions",
        lambda c, n: c.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": "tbl", "Item": {"k": {"S": f"t{i}"}}}} for i in range(n)
            ]
        ),
        100,
        "Member must have length less than or equal to 100",
    ),
    ("transaction payload", transact_payload, 98_440, "Transaction payload size cannot exceed 4MB"),
    (
        "transaction gets",
        lambda c, n: c.transact_get_items(
            TransactItems=[
                {"Get": {"TableName": "tbl", "Key": {"k": {"S": f"t{i}"}}}} for i in range(n)
            ]
        ),
        100,
        "Member must have length less than or equal to 100",
    ),
    (
        "batch write requests",
        lambda c, n: c.batch_write_item(
            RequestItems={
                "tbl": [{"PutRequest": {"Item": {"k": {"S": f"w{i}"}}}} for i in range(n)]
            }
        ),
        25,
        "Too many items requested for the BatchWriteItem call",
    ),
    (
        "batch get keys",
        lambda c, n: c.batch_get_item(
            RequestItems={"tbl": {"Keys": [{"k": {"S": f"w{i}"}} for i in range(n)]}}
        ),
        100,
        "length less than or equal to 100",
    ),
]


@pytest.mark.parametrize(
    ("what", "call", "largest", "message"), DYNAMODB_LIMITS, ids=[c[0] for c in DYNAMODB_LIMITS]
)
def test_dynamodb_accepts_up_to_the_limit_and_refuses_past_it(
    ddb: Any, deep_frames: None, what: str, call: Call, largest: int, message: str
) -> None:
    try:
        call(ddb, largest)
    except ClientError as error:  # a refused condition is an accepted request
        assert error.response["Error"]["Code"] in (
            "ConditionalCheckFailedException",
            "TransactionCanceledException",
        ), error
    with pytest.raises(ClientError) as refused:
        call(ddb, largest + 1)
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert message in refused.value.response["Error"]["Message"]


SIZES = [  # (value, DynamoDB Local's size of the attribute "v" holding it, minus the name)
    ({"S": "abc"}, 3),
    ({"S": ""}, 0),
    ({"S": "é"}, 2),
    ({"N": "0"}, 1),
    ({"N": "1"}, 2),
    ({"N": "12"}, 2),
    ({"N": "123"}, 3),
    ({"N": "1000"}, 2),
    ({"N": "-1"}, 3),
    ({"N": "-123"}, 4),
    ({"N": "0.001"}, 2),
    ({"N": "1.5"}, 3),
    ({"N": "10.01"}, 3),
    ({"N": "100.1"}, 4),
    ({"N": "1784012345678"}, 8),
    ({"N": "1784000000000"}, 4),
    ({"N": "12345678901234567890123456789012345678"}, 20),
    ({"N": "1E+100"}, 2),
    ({"B": b"abc"}, 3),
    ({"BOOL": True}, 1),
    ({"NULL": True}, 1),
    ({"L": []}, 3),
    ({"L": [{"S": "a"}, {"S": "b"}]}, 7),
    ({"L": [{"N": "1"}]}, 6),
    ({"M": {}}, 3),
    ({"M": {"a": {"S": "b"}, "c": {"S": "d"}}}, 9),
    ({"M": {"a": {"M": {"b": {"S": "c"}}}}}, 11),
    ({"SS": ["ab", "cd"]}, 4),
    ({"NS": ["1", "2"]}, 4),
    ({"BS": [b"ab"]}, 2),
]


@pytest.mark.parametrize(("value", "size"), SIZES)
def test_sizes_are_dynamodbs(ddb: Any, value: dict[str, Any], size: int) -> None:
    assert value_bytes(value) == size
    room = 409_600 - item_bytes({"k": {"S": "p"}, "v": value}) - 1  # for an attribute "p"
    put(ddb, v=value, p=S(room))
    with pytest.raises(ClientError, match="Item size has exceeded"):
        put(ddb, v=value, p=S(room + 1))


def test_all_values_are_at_most_2_mib(ddb: Any) -> None:
    """Checked before the expressions (as DynamoDB Local does), which they also outgrow."""

    def call(n: int) -> Any:
        values = V | {":a": S(1_000_000), ":b": S(1_000_000), ":c": S(n)}
        return update(
            ddb, "SET z = :v, y = :b, w = :c", "b <> :a", ExpressionAttributeValues=values
        )

    with pytest.raises(ClientError, match="Invalid UpdateExpression: Expression size has exceeded"):
        call(97_142)  # 2,097,152 with the placeholders and :v
    with pytest.raises(ClientError, match="ExpressionAttributeValues exceeds max size"):
        call(97_143)


def stored(ddb: Any, key: str) -> Any:
    return ddb.get_item(TableName="tbl", Key={"k": {"S": key}}, ConsistentRead=True).get("Item")


def test_an_update_that_outgrows_400_kb_fails_and_changes_nothing(ddb: Any) -> None:
    before = {"k": {"S": "g"}, "v": S(400_000), "n": {"N": "1"}}
    ddb.put_item(TableName="tbl", Item=before)
    grow = "SET n = n + :v, w = :w REMOVE v2"  # the first action applies in moto, then it breaks
    with pytest.raises(ClientError, match="Item size to update has exceeded") as refused:
        ddb.update_item(
            TableName="tbl",
            Key={"k": {"S": "g"}},
            UpdateExpression=grow,
            ExpressionAttributeValues=V | {":w": S(9_594)},
        )
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert stored(ddb, "g") == before
    ddb.update_item(  # just under: applies
        TableName="tbl",
        Key={"k": {"S": "g"}},
        UpdateExpression=grow,
        ExpressionAttributeValues=V | {":w": S(9_593)},
    )
    assert stored(ddb, "g")["n"] == {"N": "2"}


def test_an_update_creating_an_item_over_400_kb_creates_nothing(ddb: Any) -> None:
    with pytest.raises(ClientError, match="Item size to update has exceeded"):
        ddb.update_item(
            TableName="tbl",
            Key={"k": {"S": "new"}},
            UpdateExpression="SET w = :w",
            ExpressionAttributeValues={":w": S(409_600)},
        )
    assert stored(ddb, "new") is None


def test_a_transaction_whose_update_outgrows_400_kb_is_cancelled_whole(ddb: Any) -> None:
    before = {"k": {"S": "g"}, "v": S(BIG)}
    ddb.put_item(TableName="tbl", Item=before)
    grow = {"TableName": "tbl", "Key": {"k": {"S": "g"}}, "UpdateExpression": "SET w = :w"}
    with pytest.raises(ClientError) as refused:
        ddb.transact_write_items(
            TransactItems=[
                {"Update": grow | {"ExpressionAttributeValues": {":w": S(20_000)}}},
                {"Put": {"TableName": "tbl", "Item": {"k": {"S": "h"}}}},
            ]
        )
    assert refused.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert refused.value.response["CancellationReasons"] == [
        {
            "Code": "ValidationError",
            "Message": "Item size to update has exceeded the maximum allowed size",
        },
        {"Code": "None"},
    ]
    assert stored(ddb, "g") == before
    assert stored(ddb, "h") is None


def fill(ddb: Any, count: int, item_size: int) -> None:
    for i in range(count):  # items of item_size bytes in partition "A" of tbr
        pad = item_size - item_bytes({"k": S(1, "A"), "r": {"S": f"{i:03d}"}, "v": S(0)})
        ddb.put_item(TableName="tbr", Item={"k": S(1, "A"), "r": {"S": f"{i:03d}"}, "v": S(pad)})


def pages(call: Callable[..., Any], **request: Any) -> list[int]:
    counts, start = [], None
    while True:
        page = call(**request, **({"ExclusiveStartKey": start} if start else {}))
        counts.append(page["ScannedCount"])
        start = page.get("LastEvaluatedKey")
        if start is None:
            return counts


def test_a_query_over_1_mib_pages(ddb: Any) -> None:
    fill(ddb, 25, 102_400)  # 10 of 100 KiB make 1,000 KiB; DynamoDB takes an 11th
    request = {
        "TableName": "tbr",
        "KeyConditionExpression": "k = :k",
        "ExpressionAttributeValues": {":k": S(1, "A")},
    }
    assert pages(ddb.query, **request) == [10, 10, 5]
    assert pages(ddb.query, **request, ProjectionExpression="r") == [10, 10, 5]  # reads it all
    assert pages(ddb.scan, TableName="tbr") == [10, 10, 5]


def test_a_batch_get_over_16_mib_leaves_unprocessed_keys(ddb: Any) -> None:
    for i in range(45):
        ddb.put_item(TableName="tbl", Item={"k": {"S": f"b{i:02d}"}, "v": S(BIG)})
    keys = [{"k": {"S": f"b{i:02d}"}} for i in range(45)]
    for projection in ({}, {"ProjectionExpression": "k"}):  # the whole item counts
        got = ddb.batch_get_item(RequestItems={"tbl": {"Keys": keys, **projection}})
        assert len(got["Responses"]["tbl"]) == 40  # as DynamoDB Local: 16 MiB of 409,585 bytes
        assert len(got["UnprocessedKeys"]["tbl"]["Keys"]) == 5


def queue(sqs: Any, size: int = 262_144) -> str:
    attributes = {"MaximumMessageSize": str(size)}
    return str(sqs.create_queue(QueueName=f"q{size}", Attributes=attributes)["QueueUrl"])


FIRE_ID = {"fire_id": {"DataType": "String", "StringValue": "t:1"}}  # 7 + 6 + 3 bytes


def send(sqs: Any, url: str, n: int) -> Any:
    return sqs.send_message(QueueUrl=url, MessageBody="x" * (n - 16), MessageAttributes=FIRE_ID)


def send_batch(sqs: Any, url: str, n: int) -> Any:
    entries = [{"Id": str(i), "MessageBody": "x" * 100_000} for i in range(9)]
    entries.append({"Id": "9", "MessageBody": "é" * ((n - 900_000) // 2) + "x" * (n % 2)})
    return sqs.send_message_batch(QueueUrl=url, Entries=entries)


SQS_LIMITS: list[tuple[str, Callable[[Any, str, int], Any], int, str, str]] = [
    ("message: body and attributes", send, 262_144, "InvalidParameterValue", "shorter than 262144"),
    (
        "message: UTF-8 bytes",
        lambda s, u, n: s.send_message(QueueUrl=u, MessageBody="é" * (n // 2) + "x" * (n % 2)),
        262_144,
        "InvalidParameterValue",
        "shorter than 262144",
    ),
    (
        "message: in a batch",
        lambda s, u, n: s.send_message_batch(
            QueueUrl=u,
            Entries=[{"Id": "a", "MessageBody": "x" * (n - 16), "MessageAttributes": FIRE_ID}],
        ),
        262_144,
        "InvalidParameterValue",
        "shorter than 262144",
    ),
    (
        "attributes",
        lambda s, u, n: s.send_message(
            QueueUrl=u,
            MessageBody="x",
            MessageAttributes={
                f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(n)
            },
        ),
        10,
        "InvalidParameterValue",
        "Number of message attributes [11] exceeds the allowed maximum [10]",
    ),
    (
        "batch entries",
        lambda s, u, n: s.send_message_batch(
            QueueUrl=u, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(n)]
        ),
        10,
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        "Maximum number of entries per request are 10",
    ),
]


@pytest.mark.parametrize(
    ("what", "call", "largest", "code", "message"), SQS_LIMITS, ids=[c[0] for c in SQS_LIMITS]
)
def test_sqs_accepts_up_to_the_limit_and_refuses_past_it(
    sqs: Any, what: str, call: Callable[[Any, str, int], Any], largest: int, code: str, message: str
) -> None:
    url = queue(sqs)
    call(sqs, url, largest)
    with pytest.raises(ClientError) as refused:
        call(sqs, url, largest + 1)
    assert refused.value.response["Error"]["Code"] == code
    assert message in refused.value.response["Error"]["Message"]


def test_a_batch_is_at_most_1_mib(sqs: Any) -> None:
    url = queue(sqs, 1_048_576)
    send_batch(sqs, url, 1_048_576)
    with pytest.raises(ClientError) as refused:
        send_batch(sqs, url, 1_048_577)
    assert refused.value.response["Error"]["Code"] == "AWS.SimpleQueueService.BatchRequestTooLong"


def test_a_transaction_reading_over_4_mib_is_cancelled(ddb: Any) -> None:
    """Documented for TransactGetItems (DynamoDB Local does not enforce it)."""
    for i in range(11):
        ddb.put_item(TableName="tbl", Item={"k": {"S": f"b{i:02d}"}, "v": S(BIG)})
    gets = [{"Get": {"TableName": "tbl", "Key": {"k": {"S": f"b{i:02d}"}}}} for i in range(11)]
    assert len(ddb.transact_get_items(TransactItems=gets[:10])["Responses"]) == 10
    with pytest.raises(ClientError) as refused:
        ddb.transact_get_items(TransactItems=gets)
    assert refused.value.response["Error"]["Code"] == "TransactionCanceledException"
    reasons = refused.value.response["CancellationReasons"]
    assert [r["Code"] for r in reasons] == ["None"] * 10 + ["ValidationError"]


# ---------------------------------------------------------------- one request at a time, per table


def test_a_request_locks_every_table_it_names_in_one_order() -> None:
    assert tables_of({"TableName": "Timers", "Key": {}}) == ["Timers"]
    assert tables_of({"RequestItems": {"Wakeups": [], "Claims": []}}) == ["Claims", "Wakeups"]
    transact = {"TransactItems": [{"Update": {"TableName": "Timers"}},
                                  {"ConditionCheck": {"TableName": "Claims"}},
                                  {"Put": {"TableName": "Timers"}}]}  # fmt: skip
    assert tables_of(transact) == ["Claims", "Timers"]


def test_the_table_lock_is_handed_out_in_arrival_order() -> None:
    lock, order = FairLock(), []
    lock.acquire()
    lock.acquire()  # re-entrant: the holder's nested request does not wait on itself
    waiting = []
    for n in range(5):  # each starts waiting only after the one before it queued
        t = threading.Thread(target=lambda n=n: (lock.acquire(), order.append(n), lock.release()))
        t.start()
        while lock._next_ticket < n + 2:  # the holder took ticket 0
            time.sleep(0.001)
        waiting.append(t)
    lock.release()
    assert not order  # still held once
    lock.release()
    for t in waiting:
        t.join(timeout=10)
    assert order == [0, 1, 2, 3, 4]


def test_a_request_on_another_table_goes_on_while_one_table_is_held() -> None:
    done = threading.Event()

    def other_table() -> None:
        with tables_locked(["Other"]):
            done.set()

    with tables_locked(["Busy"]):
        t = threading.Thread(target=other_table)
        t.start()
        assert done.wait(timeout=10)
    t.join()
