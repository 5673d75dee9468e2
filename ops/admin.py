"""Tenant administration: ``python -m ops.admin <command>`` (the Makefile's ``make tenant``).

    tenant create NAME [--api-key KEY]   create the tenant, its callback queue and a key
                                         (a KEY another tenant holds is refused, not moved)
    key add NAME                         issue another key
    key revoke KEY                       revoke a key (refused within 1 s: every api
                                         sandbox checks the revocation count that often)
    queue allow NAME QUEUE_URL           let NAME target an extra queue
    queue disallow NAME QUEUE_URL        take that back
    tenant show NAME                     print the tenant
    tenant spread NAME BUCKETS           how many buckets NAME's new timers share (default 8)
    tenant rate NAME PER_SECOND          NAME's API request rate (default 50)
    webhook rotate NAME [--window-hours H]
                                         a new webhook signing secret; the old one keeps
                                         signing for H hours (default 24; 0 ends it now)

The target is the local stack (``ENV=local``, default) or the deployed stack named in
samconfig.toml (``ENV=aws``), whose outputs name the tables. The local stack is the running
``make run`` (its state file, ``$LOCAL_STATE_DIR/stack.json``, names its moto and its DynamoDB -
DynamoDB Local with ``DYNAMODB=local``); an ``AWS_PORT`` that is not that stack's means another
one: moto on that port, with DynamoDB there too, or on ``DYNAMODB_PORT`` (default 8000) with
``DYNAMODB=local``. A local stack is reached in its own region with its own fake credentials,
whatever the shell says about AWS. Every command prints one JSON object as its last stdout
line; a command that cannot be done prints one line on stderr and exits 1. Keys are stored
hashed; only the local stack's demo key can be printed again (``tenant create demo``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from pynamodb.exceptions import PynamoDBException

from ops.local import state as local_state
from ops.local.spec import samconfig
from ops.offline import LOCAL_CREDENTIALS
from ops.template import local_settings
from timers.config import Settings
from timers.core.errors import DomainError, NotFound
from timers.core.numbers import ascii_int
from timers.tenancy.tenants import TenantStore, summary, validate_name

LOCAL_SETTINGS = local_settings()


@dataclass(frozen=True)
class Target:
    settings: Settings
    sqs: Any
    known_keys: dict[str, str] = field(default_factory=dict)  # tenant -> a key we may reprint
    dynamodb: str = "DynamoDB"  # where the tables are, for messages

    @property
    def tenants(self) -> TenantStore:
        return TenantStore(self.settings.tenants_table)


class NoStack(Exception):
    """Nothing answers where the local stack would be; the message says what to do."""


def local_target(env: dict[str, str] | None = None) -> Target:
    """The local stack: where its moto and its DynamoDB are, and the process's AWS settings
    pointed there (the stack's region, fake credentials: moto keeps a region's resources apart,
    and a shell's profile, session token or endpoints are for a real account, not this one)."""
    env = dict(os.environ if env is None else env)
    running = local_state.read()
    given = f"http://127.0.0.1:{env['AWS_PORT']}" if env.get("AWS_PORT") else None
    if running is not None and given in (None, running["aws_endpoint"]):
        endpoint = running["aws_endpoint"]
        dynamodb = running.get("dynamodb_endpoint") or endpoint
    else:  # no stack's state here, or AWS_PORT names another stack: its settings say where
        endpoint = given or "http://127.0.0.1:4566"
        local = env.get("DYNAMODB") == "local"
        dynamodb = f"http://127.0.0.1:{env.get('DYNAMODB_PORT') or 8000}" if local else endpoint
    if not _answers(endpoint):
        raise NoStack(
            f"no local stack answers at {endpoint}: start one with make run "
            "(or ENV=aws for the deployed stack)"
        )
    if not _answers(dynamodb):
        raise NoStack(
            f"the local stack's DynamoDB does not answer at {dynamodb} (its moto does, at "
            f"{endpoint}): restart the stack (make run; DYNAMODB=local for DynamoDB Local)"
        )
    for name in [n for n in os.environ if n.startswith(_SHELL_AWS)]:
        del os.environ[name]
    os.environ.update(
        LOCAL_CREDENTIALS,
        AWS_DEFAULT_REGION=samconfig().get("region") or "us-east-1",  # the stack's (spec.py)
        AWS_ENDPOINT_URL=endpoint,  # pynamodb and boto3 both honour these
        AWS_ENDPOINT_URL_DYNAMODB=dynamodb,  # DynamoDB Local with DYNAMODB=local
    )
    demo = running["demo"] if running and running["aws_endpoint"] == endpoint else None
    known = {demo["tenant"]: demo["api_key"]} if demo else {}
    return Target(LOCAL_SETTINGS, boto3.client("sqs"), known, dynamodb)


_SHELL_AWS = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION",
              "AWS_ENDPOINT_URL", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")  # fmt: skip
"""What a shell may set for a real AWS account (AWS_ENDPOINT_URL_* too, by its prefix),
dropped before the local stack is reached."""


def _answers(endpoint: str) -> bool:
    """Whether something listens at ``endpoint`` (http://host:port)."""
    host, _, port = endpoint.removeprefix("http://").partition(":")
    try:
        with socket.create_connection((host, int(port or 80)), timeout=1):
            return True
    except (OSError, ValueError):
        return False


def aws_target() -> Target:
    """Table names and queue prefix from the outputs of the stack samconfig.toml deploys."""
    config = samconfig()
    stack, region = config["stack_name"], config.get("region")
    cfn = boto3.client("cloudformation", region_name=region)
    outputs = {
        o["OutputKey"]: o["OutputValue"]
        for o in cfn.describe_stacks(StackName=stack)["Stacks"][0].get("Outputs", [])
    }
    if region:
        os.environ["AWS_DEFAULT_REGION"] = region
    settings = Settings(
        timers_table=outputs["TimersTableName"],
        claims_table=outputs["ClaimsTableName"],
        wakeups_table=outputs["WakeupsTableName"],
        tenants_table=outputs["TenantsTableName"],
        idempotency_table=outputs["IdempotencyTableName"],
        groups_table=outputs.get("GroupsTableName", "groups"),
        tenant_queue_prefix=outputs["TenantQueuePrefix"],
    )
    return Target(settings, boto3.client("sqs", region_name=region))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def create_tenant(target: Target, name: str, api_key: str | None = None) -> dict[str, Any]:
    """Create (or complete) a tenant: its callback queue, its record and a key. Idempotent."""
    validate_name(name)
    queue = target.sqs.create_queue(QueueName=f"{target.settings.tenant_queue_prefix}{name}")
    tenants = target.tenants
    tenant = tenants.put_tenant(name, queue["QueueUrl"], now_ms())
    key = tenants.add_key(name, now_ms(), api_key)
    return {**summary(tenant), "api_key": key}


def run(target: Target, argv: Sequence[str]) -> dict[str, Any]:
    return execute(target, _parser().parse_args(argv))


def execute(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    tenants = target.tenants
    match (args.noun, args.verb):
        case ("tenant", "create"):
            key = args.api_key or target.known_keys.get(args.name)
            return create_tenant(target, args.name, key)
        case ("tenant", "show"):
            tenant = tenants.get_tenant(args.name)
            if tenant is None:
                raise NotFound(f"no tenant {args.name!r}")
            return {
                **summary(tenant),
                "allowed_queue_urls": sorted(tenant.allowed_queue_urls),
                "spread": tenant.spread,
            }
        case ("tenant", "spread"):
            tenant = tenants.set_spread(args.name, args.buckets)
            return {"tenant": tenant.name, "spread": tenant.spread}
        case ("tenant", "rate"):
            tenant = tenants.set_rate_limit(args.name, args.per_second)
            return {"tenant": tenant.name, "rate_limit_per_s": tenant.rate_limit_per_s}
        case ("key", "add"):
            return {"tenant": args.name, "api_key": tenants.add_key(args.name, now_ms())}
        case ("key", "revoke"):
            return {"revoked": tenants.revoke_key(args.api_key)}
        case ("queue", "allow"):
            tenant = tenants.allow_queue(args.name, args.queue_url)
            return {"tenant": tenant.name, "allowed_queue_urls": sorted(tenant.allowed_queue_urls)}
        case ("webhook", "rotate"):
            window_ms = int(args.window_hours * 3_600_000)
            tenant = tenants.rotate_secret(args.name, now_ms(), window_ms)
            return {
                "tenant": tenant.name,
                "webhook_secret": tenant.webhook_secret,
                "previous_valid_until_ms": max(
                    (until for _, until in tenant.webhook_secrets[1:] if until), default=None
                ),
            }
        case ("queue", "disallow"):
            tenant = tenants.disallow_queue(args.name, args.queue_url)
            return {"tenant": tenant.name, "allowed_queue_urls": sorted(tenant.allowed_queue_urls)}
    raise AssertionError("unreachable: argparse accepts only the commands above")


def _whole(text: str) -> int:
    """A whole number in ASCII digits (``int()`` takes any script's)."""
    value = ascii_int(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"not a whole number (0-9): {text!r}")
    return value


def _hours(text: str) -> float:
    if not re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
        raise argparse.ArgumentTypeError(f"not a number of hours (0-9, e.g. 1.5): {text!r}")
    return float(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.admin",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    nouns = parser.add_subparsers(dest="noun", required=True)
    tenant = nouns.add_parser("tenant").add_subparsers(dest="verb", required=True)
    create = tenant.add_parser("create")
    create.add_argument("name")
    create.add_argument("--api-key", help="register this key instead of generating one")
    tenant.add_parser("show").add_argument("name")
    spread = tenant.add_parser("spread", help="how many buckets the tenant's new timers share")
    spread.add_argument("name")
    spread.add_argument("buckets", type=_whole)
    rate = tenant.add_parser("rate", help="the tenant's API request rate (per second)")
    rate.add_argument("name")
    rate.add_argument("per_second", type=_whole)
    key = nouns.add_parser("key").add_subparsers(dest="verb", required=True)
    key.add_parser("add").add_argument("name")
    key.add_parser("revoke").add_argument("api_key")
    queue = nouns.add_parser("queue").add_subparsers(dest="verb", required=True)
    for verb in ("allow", "disallow"):
        p = queue.add_parser(verb)
        p.add_argument("name")
        p.add_argument("queue_url")
    webhook = nouns.add_parser("webhook").add_subparsers(dest="verb", required=True)
    rotate = webhook.add_parser("rotate", help="a new signing secret, the old one still signs")
    rotate.add_argument("name")
    rotate.add_argument("--window-hours", type=_hours, default=24.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)  # a usage error: exit 2
    target = None
    try:
        target = aws_target() if os.environ.get("ENV", "local") == "aws" else local_target()
        result = execute(target, args)
    except (NoStack, DomainError, PynamoDBException, BotoCoreError, ClientError) as exc:
        print(f"ops.admin: {failure(exc, target)}", file=sys.stderr)  # one line, no traceback
        return 1
    print(json.dumps(result))
    return 0


def failure(exc: Exception, target: Target | None) -> str:
    """What stopped a command, in one line."""
    if isinstance(exc, DomainError):
        details = "; ".join(f"{d.field}: {d.message}" for d in exc.details)
        return f"{exc.message} ({details})" if details else exc.message
    cause = exc.cause if isinstance(exc, PynamoDBException) and exc.cause is not None else exc
    if isinstance(cause, ClientError):
        error = cause.response.get("Error", {})
        code, message = error.get("Code", "error"), error.get("Message", "")
        if code == "ResourceNotFoundException" and target is not None:
            return (
                f"no table {target.settings.tenants_table} at {target.dynamodb} ({message}): "
                "is that the DynamoDB of this project's stack? (make run writes where it is "
                "into .local/stack.json; DYNAMODB=local with DYNAMODB_PORT names DynamoDB Local)"
            )
        return f"{cause.operation_name}: {code}: {message}"
    return " ".join(str(exc).split())  # botocore's own messages say what and where


if __name__ == "__main__":
    sys.exit(main())
