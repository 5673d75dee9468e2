"""Tenants: create one, its webhook signing secrets (and their rotation), the queues it may
target, its spread and rate; :class:`TenantStore` has its API keys too (timers.tenancy.keys),
all in the tenants table (timers.tenancy.table).
"""

from __future__ import annotations

from typing import Any

from timers.core.errors import FieldError, InvalidInput
from timers.core.timer import TENANT_NAME
from timers.core.webhook_attempts import new_secret
from timers.tenancy.keys import ApiKeys
from timers.tenancy.table import (
    Tenant,
    secrets_from_json,
    secrets_to_json,
    tenant_pk,
    to_tenant,
)

ROTATION_WINDOW_MS = 24 * 3_600_000
"""How long a rotated-out webhook secret keeps signing: consumers switch within it."""


def validate_name(name: str) -> None:
    if not TENANT_NAME.fullmatch(name):
        raise InvalidInput(
            "invalid tenant name",
            [FieldError("name", "1-40 characters: lower-case letters, digits and '-'")],
        )


class TenantStore(ApiKeys):
    """Tenants, their keys and the revocation count, in one tenants table."""

    def signing_secrets(self, name: str, now_ms: int) -> list[str]:
        """The secrets that sign a tenant's webhooks now (none: no such tenant)."""
        tenant = self.get_tenant(name)
        return tenant.signing_secrets(now_ms) if tenant else []

    def put_tenant(self, name: str, callback_queue_url: str, now_ms: int) -> Tenant:
        """Create the tenant record if absent; an existing tenant is returned unchanged."""
        validate_name(name)
        existing = self.get_tenant(name)
        if existing:
            if existing.webhook_secret is None:  # a tenant from before webhooks: give it one
                return self.rotate_secret(name, now_ms, window_ms=0)
            return existing
        secret = ((new_secret(), None),)
        self.models.tenant(
            tenant_pk(name),
            name=name,
            callback_queue_url=callback_queue_url,
            created_ms=now_ms,
            webhook_secrets=secrets_to_json(secret),
        ).save(condition=self.models.tenant.pk.does_not_exist())
        return Tenant(name=name, callback_queue_url=callback_queue_url, webhook_secrets=secret,
                      created_ms=now_ms)  # fmt: skip

    def rotate_secret(self, name: str, now_ms: int, window_ms: int = ROTATION_WINDOW_MS) -> Tenant:
        """A new current webhook secret; the previous one keeps signing for ``window_ms`` (both
        signatures are sent meanwhile), older ones stop. Conditional on the secrets read, so two
        rotations at once cannot lose one."""
        item = self._get_item(name)
        before = item.webhook_secrets
        current = secrets_from_json(before)
        kept = [(s, now_ms + window_ms) for s, until in current[:1] if window_ms > 0]
        entries = ((new_secret(), None), *kept)
        held = self.models.tenant.webhook_secrets
        condition = held.does_not_exist() if before is None else held == before
        item.update(actions=[held.set(secrets_to_json(entries))], condition=condition)
        return to_tenant(item)

    def allow_queue(self, name: str, queue_url: str) -> Tenant:
        """Let the tenant target an extra queue (it must also be inside the trigger's IAM scope)."""
        item = self._get_item(name)
        item.update(actions=[self.models.tenant.allowed_queue_urls.add({queue_url})])
        return to_tenant(item)

    def set_spread(self, name: str, spread: int) -> Tenant:
        """How many buckets the tenant's *new* timers share (existing timers keep theirs)."""
        if not 1 <= spread <= 4_096:
            raise InvalidInput("invalid spread", [FieldError("spread", "from 1 to 4096")])
        item = self._get_item(name)
        item.update(actions=[self.models.tenant.spread.set(spread)])
        return to_tenant(item)

    def set_rate_limit(self, name: str, per_second: int) -> Tenant:
        """The tenant's API request rate (requests per second, all its keys together)."""
        if not 1 <= per_second <= 1_000_000:
            raise InvalidInput("invalid rate", [FieldError("per_second", "from 1 to 1000000")])
        item = self._get_item(name)
        item.update(actions=[self.models.tenant.rate_limit_per_s.set(per_second)])
        return to_tenant(item)

    def disallow_queue(self, name: str, queue_url: str) -> Tenant:
        item = self._get_item(name)
        item.update(actions=[self.models.tenant.allowed_queue_urls.delete({queue_url})])
        return to_tenant(item)


def summary(tenant: Tenant) -> dict[str, Any]:
    return {
        "tenant": tenant.name,
        "callback_queue_url": tenant.callback_queue_url,
        "webhook_secret": tenant.webhook_secret,
    }
