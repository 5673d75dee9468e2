"""The tenants table (DynamoDB, one table keyed by ``pk``): its items, what a tenant item reads
as, and the table bound to its models (timers.tenancy.keys and timers.tenancy.tenants build on
it).

- ``TENANT#<name>``: the tenant, its callback queue and the extra queues it may target.
  It also holds the tenant's webhook signing secrets (``whsec_...``, newest first; during a
  rotation the previous one signs too until its ``until``), and its list of API keys.
- ``KEY#<sha256 of the key>``: one API key (timers.tenancy.keys).
- ``REVOCATIONS``: how many keys were ever revoked (timers.tenancy.keys, timers.tenancy.auth).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pynamodb.attributes import NumberAttribute, UnicodeAttribute, UnicodeSetAttribute
from pynamodb.models import Model

from timers.core.errors import NotFound
from timers.store.dynamodb import bound_model

DEFAULT_RATE_LIMIT_PER_S = 50
DEFAULT_SPREAD = 8
"""Partitions a tenant's timers share (timers.engine.entries.partition_for): one tenant's burst
occupies at most this many Redis buckets and claim items per second. A tenant whose bursts
exceed ~50 timers per partition and second (a claim write's chunk) gets more."""


class TenantItem(Model):
    """The schemas of the tenants table's items (this one, ApiKeyItem, RevocationsItem); a
    TenantStore binds them to its table."""

    pk = UnicodeAttribute(hash_key=True)
    name = UnicodeAttribute()
    callback_queue_url = UnicodeAttribute()
    allowed_queue_urls = UnicodeSetAttribute(null=True)
    rate_limit_per_s = NumberAttribute(default=DEFAULT_RATE_LIMIT_PER_S)
    spread = NumberAttribute(default=DEFAULT_SPREAD)
    created_ms = NumberAttribute()
    # JSON list, newest first: [{"s": "whsec_...", "until": ms or null}, ...]
    webhook_secrets = UnicodeAttribute(null=True)
    # JSON list, oldest first: [{"id": key_id, "h": sha256, "c": created ms, "l": label}, ...]
    api_keys = UnicodeAttribute(null=True)


class ApiKeyItem(Model):
    pk = UnicodeAttribute(hash_key=True)
    tenant = UnicodeAttribute()
    key_id = UnicodeAttribute()
    created_ms = NumberAttribute()
    label = UnicodeAttribute(null=True)
    last_used_ms = NumberAttribute(null=True)


class RevocationsItem(Model):
    pk = UnicodeAttribute(hash_key=True)
    revoked = NumberAttribute(default=0)


@dataclass(frozen=True)
class TenantModels:
    """The models on one tenants table."""

    tenant: type[TenantItem]
    api_key: type[ApiKeyItem]
    revocations: type[RevocationsItem]


def models_for(table: str) -> TenantModels:
    return TenantModels(
        bound_model(TenantItem, table),
        bound_model(ApiKeyItem, table),
        bound_model(RevocationsItem, table),
    )


@dataclass(frozen=True)
class Tenant:
    name: str
    callback_queue_url: str
    allowed_queue_urls: frozenset[str] = field(default_factory=frozenset)
    rate_limit_per_s: int = DEFAULT_RATE_LIMIT_PER_S
    spread: int = DEFAULT_SPREAD
    webhook_secrets: tuple[tuple[str, int | None], ...] = ()  # (secret, until), newest first
    created_ms: int = 0

    @property
    def webhook_secret(self) -> str | None:
        """The current secret (what GET /v1/tenant shows)."""
        return self.webhook_secrets[0][0] if self.webhook_secrets else None

    def signing_secrets(self, now_ms: int) -> list[str]:
        """Every secret that signs now: the current one, and one rotated out within its window."""
        return [s for s, until in self.webhook_secrets if until is None or until > now_ms]

    def may_target(self, queue_url: str) -> bool:
        return queue_url == self.callback_queue_url or queue_url in self.allowed_queue_urls


def tenant_pk(name: str) -> str:
    return f"TENANT#{name}"


def to_tenant(item: TenantItem) -> Tenant:
    return Tenant(
        name=item.name,
        callback_queue_url=item.callback_queue_url,
        allowed_queue_urls=frozenset(item.allowed_queue_urls or ()),
        rate_limit_per_s=int(item.rate_limit_per_s),
        spread=int(item.spread),
        webhook_secrets=secrets_from_json(item.webhook_secrets),
        created_ms=int(item.created_ms or 0),
    )


def secrets_from_json(text: str | None) -> tuple[tuple[str, int | None], ...]:
    if not text:
        return ()
    return tuple((str(e["s"]), e.get("until")) for e in json.loads(text))


def secrets_to_json(entries: tuple[tuple[str, int | None], ...]) -> str:
    return json.dumps([{"s": s, "until": until} for s, until in entries])


class TenantsTable:
    """The tenants table bound to its models, and the clock its writes stamp."""

    def __init__(self, table: str, clock: Callable[[], int] | None = None) -> None:
        self.models = models_for(table)
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)

    def get_tenant(self, name: str) -> Tenant | None:
        try:
            return to_tenant(self.models.tenant.get(tenant_pk(name), consistent_read=True))
        except self.models.tenant.DoesNotExist:
            return None

    def _get_item(self, name: str) -> TenantItem:
        try:
            return self.models.tenant.get(tenant_pk(name), consistent_read=True)
        except self.models.tenant.DoesNotExist:
            raise NotFound(f"no tenant {name!r}") from None
