"""Read template.yaml, the single source of truth for what the service is made of.

The test suite and the local stack create DynamoDB tables from it, so the code can never drift
from what ``sam deploy`` creates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from timers.config import Settings

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "template.yaml"


@dataclass(frozen=True)
class Tag:
    """An unresolved CloudFormation intrinsic such as ``!Ref X`` (name='Ref', value='X')."""

    name: str
    value: Any


class _Loader(yaml.SafeLoader):
    pass


def _intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Tag:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return Tag(suffix, value)


_Loader.add_multi_constructor("!", _intrinsic)


@cache
def load(path: Path = TEMPLATE) -> dict[str, Any]:
    with path.open() as f:
        doc: dict[str, Any] = yaml.load(f, Loader=_Loader)
    return doc


def as_deployed(value: Any, path: Path = TEMPLATE) -> Any:
    """A literal, or the default of the parameter a ``!Ref`` names: what a deployment with
    the default parameters gets."""
    if isinstance(value, Tag) and value.name == "Ref":
        return load(path)["Parameters"][value.value]["Default"]
    return value


def resources(kind: str, path: Path = TEMPLATE) -> dict[str, dict[str, Any]]:
    """Logical id -> Properties of every resource of one CloudFormation type."""
    return resources_of(load(path), kind)


def resources_of(doc: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """:func:`resources` of a template already loaded."""
    return {
        name: res.get("Properties", {})
        for name, res in doc["Resources"].items()
        if res["Type"] == kind
    }


def create_tables(dynamodb: Any, names: dict[str, str] | None = None) -> None:
    """Create every table of the template, with its TTL, through a boto3 DynamoDB client.

    ``names`` maps a table's logical id to the name to create it under (default: the id).
    """
    for logical_id, props in resources("AWS::DynamoDB::Table").items():
        name = (names or {}).get(logical_id, logical_id)
        request: dict[str, Any] = {
            "TableName": name,
            "AttributeDefinitions": props["AttributeDefinitions"],
            "KeySchema": props["KeySchema"],
            "BillingMode": props.get("BillingMode", "PAY_PER_REQUEST"),
        }
        if props.get("GlobalSecondaryIndexes"):
            request["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
        dynamodb.create_table(**request)
        ttl = props.get("TimeToLiveSpecification", {})
        if ttl.get("Enabled"):
            dynamodb.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
            )


def create_queues(sqs: Any, account: str = "123456789012") -> None:
    """Create every SQS queue of the template, named by its logical id (as the local stack's
    template resolver assumes), through a boto3 SQS client; dead-letter queues first, so a
    redrive policy names a queue that exists."""
    queues = resources("AWS::SQS::Queue")
    region = sqs.meta.region_name
    for logical_id, props in sorted(queues.items(), key=lambda q: "RedrivePolicy" in q[1]):
        attributes: dict[str, str] = {
            key: str(props[key]).lower() if isinstance(props[key], bool) else str(props[key])
            for key in ("FifoQueue", "VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds")
            if key in props
        }
        redrive = props.get("RedrivePolicy")
        if redrive:
            target = redrive["deadLetterTargetArn"]
            dlq = target.value.split(".")[0] if isinstance(target, Tag) else str(target)
            if dlq in queues:
                dlq = f"arn:aws:sqs:{region}:{account}:{dlq}"
            attributes["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": dlq, "maxReceiveCount": int(redrive["maxReceiveCount"])}
            )
        name = logical_id + (".fifo" if props.get("FifoQueue") else "")
        sqs.create_queue(QueueName=name, Attributes=attributes)


TABLE_SETTINGS = {
    "TimersTable": "timers_table",
    "ClaimsTable": "claims_table",
    "WakeupsTable": "wakeups_table",
    "TenantsTable": "tenants_table",
    "IdempotencyTable": "idempotency_table",
    "FailedFiresTable": "failed_fires_table",
    "GroupsTable": "groups_table",
}
"""Logical id of each table -> the Settings field that names it."""


def local_settings(**overrides: Any) -> Settings:
    """Settings that name each table by its logical id: how the tests and local stack make them."""
    names: dict[str, Any] = {field: logical_id for logical_id, field in TABLE_SETTINGS.items()}
    return Settings(**{**names, **overrides})
