"""Tenant administration (make tenant and friends) against moto; with ``--dynamodb=local``
(make test-real) its tables are on DynamoDB Local."""

from __future__ import annotations

import boto3
import pytest

from ops import admin
from timers.core.errors import InvalidInput, InvalidState, NotFound

pytestmark = pytest.mark.real_parts


@pytest.fixture
def target(aws_tables: str | None) -> admin.Target:
    return admin.Target(admin.LOCAL_SETTINGS, boto3.client("sqs"))


def test_create_tenant_makes_queue_record_and_a_working_key(target: admin.Target) -> None:
    out = admin.run(target, ["tenant", "create", "acme"])
    assert out["tenant"] == "acme"
    assert out["callback_queue_url"].endswith("/timers-tenant-acme")
    assert out["api_key"].startswith("tk_")
    assert boto3.client("sqs").get_queue_url(QueueName="timers-tenant-acme")["QueueUrl"]
    tenant = target.tenants.authenticate(out["api_key"])
    assert tenant is not None
    assert (tenant.name, tenant.callback_queue_url) == ("acme", out["callback_queue_url"])
    assert out["webhook_secret"] == tenant.webhook_secret
    assert tenant.webhook_secret is not None and tenant.webhook_secret.startswith("whsec_")


def test_webhook_rotate_keeps_the_old_secret_signing_for_the_window(
    target: admin.Target,
) -> None:
    old = admin.run(target, ["tenant", "create", "acme"])["webhook_secret"]
    out = admin.run(target, ["webhook", "rotate", "acme", "--window-hours", "2"])
    assert out["webhook_secret"] != old and out["webhook_secret"].startswith("whsec_")
    until = out["previous_valid_until_ms"]
    assert until is not None
    assert target.tenants.signing_secrets("acme", until - 1) == [out["webhook_secret"], old]
    assert target.tenants.signing_secrets("acme", until) == [out["webhook_secret"]]
    shown = admin.run(target, ["tenant", "show", "acme"])
    assert shown["webhook_secret"] == out["webhook_secret"]
    # a second rotation retires the first secret at once (only the last one overlaps)
    third = admin.run(target, ["webhook", "rotate", "acme", "--window-hours", "0"])
    assert target.tenants.signing_secrets("acme", until - 1) == [third["webhook_secret"]]


def test_keys_are_stored_hashed(target: admin.Target) -> None:
    key = admin.run(target, ["tenant", "create", "acme"])["api_key"]
    items = boto3.client("dynamodb").scan(TableName="TenantsTable")["Items"]
    assert key not in str(items)


def test_create_is_idempotent_and_can_register_a_given_key(target: admin.Target) -> None:
    first = admin.run(target, ["tenant", "create", "demo", "--api-key", "tk_demo-key"])
    again = admin.run(target, ["tenant", "create", "demo", "--api-key", "tk_demo-key"])
    assert first == again
    assert target.tenants.authenticate("tk_demo-key") is not None


def test_add_and_revoke_keys(target: admin.Target) -> None:
    first = admin.run(target, ["tenant", "create", "acme"])["api_key"]
    second = admin.run(target, ["key", "add", "acme"])["api_key"]
    assert first != second
    assert admin.run(target, ["key", "revoke", first]) == {"revoked": True}
    assert target.tenants.authenticate(first) is None
    assert target.tenants.authenticate(second) is not None
    assert admin.run(target, ["key", "revoke", first]) == {"revoked": False}


def test_a_registered_key_is_never_moved_to_another_tenant(target: admin.Target) -> None:
    """``add key`` writes only where no key record is: registering a key another tenant holds
    (a typo, or an operator tricked into it) must not hand that tenant's timers over."""
    admin.run(target, ["tenant", "create", "acme", "--api-key", "tk_shared-key"])
    with pytest.raises(InvalidState, match="already registered to another tenant"):
        admin.run(target, ["tenant", "create", "evil", "--api-key", "tk_shared-key"])
    owner = target.tenants.authenticate("tk_shared-key")
    assert owner is not None and owner.name == "acme"
    # the same key for the same tenant again is still a no-op (tenant create is idempotent)
    admin.run(target, ["tenant", "create", "acme", "--api-key", "tk_shared-key"])
    with pytest.raises(InvalidState):
        target.tenants.add_key("evil", 0, "tk_shared-key")
    owner = target.tenants.authenticate("tk_shared-key")
    assert owner is not None and owner.name == "acme"


def test_allow_and_disallow_a_queue(target: admin.Target) -> None:
    admin.run(target, ["tenant", "create", "acme"])
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/acme-orders"
    assert admin.run(target, ["queue", "allow", "acme", url])["allowed_queue_urls"] == [url]
    tenant = target.tenants.get_tenant("acme")
    assert tenant is not None and tenant.may_target(url)
    assert admin.run(target, ["queue", "disallow", "acme", url])["allowed_queue_urls"] == []


@pytest.mark.parametrize("name", ["Acme", "a_b", "", "x" * 41, "ü", "acme\n"])
def test_bad_tenant_names_are_refused_and_create_nothing(target: admin.Target, name: str) -> None:
    with pytest.raises(InvalidInput):
        admin.run(target, ["tenant", "create", name])
    assert boto3.client("sqs").list_queues().get("QueueUrls", []) == []


def test_unknown_tenant_is_not_found(target: admin.Target) -> None:
    with pytest.raises(NotFound):
        admin.run(target, ["key", "add", "ghost"])
