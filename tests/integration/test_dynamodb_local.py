"""DynamoDB Local (ops.dynamodb_local) holds the template's tables, the project's adapters reach
it through AWS_ENDPOINT_URL_DYNAMODB, and it is DynamoDB's own behaviour they meet there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from ops import template
from ops.dynamodb_local import client, java_major
from ops.template import local_settings
from tests.support.real_parts import dynamodb_at
from timers.tenancy.tenants import TenantStore

pytestmark = [pytest.mark.integration, pytest.mark.real_parts]


@pytest.fixture
def dynamodb(dynamodb_local: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """This process's DynamoDB on DynamoDB Local (emptied), everything else on moto."""
    with mock_aws(), dynamodb_at(dynamodb_local, monkeypatch):
        yield client(dynamodb_local)


def test_it_holds_the_templates_tables(dynamodb: Any) -> None:
    tables = set(dynamodb.list_tables()["TableNames"])
    assert tables == set(template.resources("AWS::DynamoDB::Table"))
    timers = dynamodb.describe_table(TableName="TimersTable")["Table"]
    expected = template.resources("AWS::DynamoDB::Table")["TimersTable"]
    assert timers["KeySchema"] == expected["KeySchema"]


def test_the_adapters_reach_it_through_the_standard_variable(dynamodb: Any) -> None:
    assert os.environ["AWS_ENDPOINT_URL_DYNAMODB"] == dynamodb.meta.endpoint_url
    tenants = TenantStore(local_settings().tenants_table)
    sqs = boto3.client("sqs")  # still moto's
    queue = sqs.create_queue(QueueName="timers-tenant-acme")["QueueUrl"]

    tenants.put_tenant("acme", queue, 1_000)  # pynamodb

    assert dynamodb.scan(TableName="TenantsTable")["Count"] == 1
    assert tenants.get_tenant("acme") is not None
    assert boto3.client("dynamodb").list_tables()["TableNames"]  # boto3 too


def test_it_enforces_dynamodbs_item_size_limit(dynamodb: Any) -> None:
    item = {"k": {"S": "x"}, "blob": {"S": "x" * 410_000}}  # over 400 KiB
    with pytest.raises(ClientError) as refused:
        dynamodb.put_item(TableName="ClaimsTable", Item=item)
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "size" in refused.value.response["Error"]["Message"].lower()


def test_it_refuses_an_expression_value_no_expression_uses(dynamodb: Any) -> None:
    with pytest.raises(ClientError) as refused:
        dynamodb.update_item(
            TableName="ClaimsTable",
            Key={"k": {"S": "x"}},
            UpdateExpression="SET a = :a",
            ExpressionAttributeValues={":a": {"N": "1"}, ":unused": {"N": "2"}},
        )
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert ":unused" in refused.value.response["Error"]["Message"]


def test_java_versions_are_read_old_and_new() -> None:
    assert java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert java_major('java version "1.8.0_402"') == 8
    assert java_major("no java here") is None
