"""A tenant's API keys, in the tenants table (timers.tenancy.table).

- ``KEY#<sha256 of the key>``: one API key. Keys are stored only as hashes and never logged;
  the ``key_id`` (first characters of the key) lets an operator tell keys apart. It is the
  tenant's only: a key whose first characters another key of the tenant has (keys an admin
  gave) gets them and a part of its hash (``tk_shared_.1f0c9a2b``).
- The tenant item's ``api_keys`` lists its keys (JSON, oldest first: ``key_id``, hash, created,
  label): what ``GET /v1/tenant/keys`` shows, never emptied by a revocation through the API. A
  new key (the API's, the admin's) joins it only while it holds fewer than KEYS_MAX. A key
  registered before the list existed is added to it when next used, even past KEYS_MAX: it
  exists already, and hidden from the list its tenant could neither see nor revoke it.
- ``REVOCATIONS``: how many keys were ever revoked. An api sandbox that remembers keys reads it
  (timers.tenancy.auth) and forgets every key it remembers when it moved.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pynamodb.exceptions import TransactWriteError, UpdateError
from pynamodb.transactions import TransactWrite

from timers.core.errors import ConcurrentUpdate, FieldError, InvalidInput, InvalidState, NotFound
from timers.tenancy.table import (
    ApiKeyItem,
    Tenant,
    TenantItem,
    TenantsTable,
    tenant_pk,
    to_tenant,
)

KEY_PREFIX = "tk_"
REVOCATIONS_PK = "REVOCATIONS"
KEYS_MAX = 10
"""API keys a tenant keeps at most."""
KEY_ID_CHARS = 10
"""A key's id is its first characters (not a secret), made the tenant's only (_distinct)..."""
SHOWN_FROM_CHARS = 32
"""... if the key is at least this long (a generated one is 46): of a shorter key (an admin's,
TIMERS_DEMO_API_KEY) the first characters would be much of the secret, so its id is a piece
of its hash instead."""


def key_id_of(api_key: str, digest: str) -> str:
    """A new key's id: its first characters, or (a short key) ``key_`` and a piece of its
    hash; never the secret."""
    if len(api_key) >= SHOWN_FROM_CHARS:
        return api_key[:KEY_ID_CHARS]
    return f"key_{digest[:KEY_ID_CHARS]}"


LABEL_MAX = 128
LAST_USED_EVERY_MS = 60_000
"""A key's ``last_used_at`` is written when a lookup finds it older than this: a lookup
happens once per key and api sandbox per AUTH_CACHE_MS, so it is right to about a minute."""


@dataclass(frozen=True)
class ApiKey:
    """One of a tenant's keys, as listed (never the key itself)."""

    key_id: str
    digest: str  # sha256 of the key: names its item
    created_ms: int
    label: str | None = None
    last_used_ms: int | None = None


def _keys(text: str | None) -> list[ApiKey]:
    if not text:
        return []
    return _distinct([ApiKey(e["id"], e["h"], int(e["c"]), e.get("l")) for e in json.loads(text)])


def _distinct(keys: list[ApiKey]) -> list[ApiKey]:
    """The keys, each with an id no earlier one has: a key whose id is taken (its first
    characters are another's: admin-given keys, or a list written before ids were kept apart)
    shows them and a part of its hash. The first keeps its id, so a stored id still names the
    key it named; a list written back keeps the ids shown."""
    seen: set[str] = set()
    out: list[ApiKey] = []
    for key in keys:
        if key.key_id in seen:
            key_id = f"{key.key_id[:KEY_ID_CHARS]}.{key.digest[:8]}"
            key = replace(key, key_id=key_id if key_id not in seen else key.digest)
        seen.add(key.key_id)
        out.append(key)
    return out


def _keys_json(keys: list[ApiKey]) -> str:
    return json.dumps([{"id": k.key_id, "h": k.digest, "c": k.created_ms, "l": k.label}
                       for k in keys], separators=(",", ":"))  # fmt: skip


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def key_hash(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class ApiKeys(TenantsTable):
    """A TenantStore's keys: authenticate one, list, create and revoke them, count the
    revocations."""

    def authenticate(self, api_key: str | None) -> Tenant | None:
        """The tenant an API key belongs to, or None for a missing, unknown or revoked key."""
        if not api_key:
            return None
        try:
            # consistent: a replica's stale "still there" just after a revocation would be
            # remembered by this sandbox after it read the moved count
            key = self.models.api_key.get(f"KEY#{key_hash(api_key)}", consistent_read=True)
        except self.models.api_key.DoesNotExist:
            return None
        try:
            item = self.models.tenant.get(tenant_pk(key.tenant), consistent_read=True)
        except self.models.tenant.DoesNotExist:
            return None
        self._note_use(key, item)
        return to_tenant(item)

    def _note_use(self, key: ApiKeyItem, tenant: TenantItem) -> None:
        """Keep ``last_used_at`` to about a minute, and list a key from before the list
        (best effort: authentication never fails on it)."""
        now = self.clock()
        try:
            if key.last_used_ms is None or now - int(key.last_used_ms) >= LAST_USED_EVERY_MS:
                key.update(
                    actions=[self.models.api_key.last_used_ms.set(now)],
                    condition=self.models.api_key.pk.exists(),
                )  # not a revoked one
            keys = _keys(tenant.api_keys)
            if not any(k.digest == key.pk[4:] for k in keys):
                listed = ApiKey(key.key_id, key.pk[4:], int(key.created_ms), key.label)
                # only while the key still exists: one revoked since it was read is not back;
                # past KEYS_MAX too: it exists, and unlisted its tenant could not revoke it
                self._transact_keys(tenant, [*keys, listed], existing=key)
        except (UpdateError, ValueError, ConcurrentUpdate):
            pass

    def _relist(self, tenant: TenantItem, keys: list[ApiKey]) -> None:
        tenant.update(*self._list_write(tenant, keys))

    def _list_write(self, tenant: TenantItem, keys: list[ApiKey]) -> tuple[list[Any], Any]:
        """The update of the tenant's key list to ``keys``, on condition it is as read."""
        held, before = self.models.tenant.api_keys, tenant.api_keys
        condition = held.does_not_exist() if before is None else held == before
        return [held.set(_keys_json(_distinct(keys)))], condition

    # ---------------------------------------------------------------- a tenant's own keys

    def list_keys(self, name: str) -> list[ApiKey]:
        """The tenant's keys, oldest first, with when each was last used."""
        keys = _keys(self._get_item(name).api_keys)
        used = {
            item.pk[4:]: item.last_used_ms
            for item in self.models.api_key.batch_get([f"KEY#{k.digest}" for k in keys])
        } if keys else {}  # fmt: skip
        return [
            ApiKey(k.key_id, k.digest, k.created_ms, k.label, _int(used.get(k.digest)))
            for k in keys
        ]

    def create_key(self, name: str, now_ms: int, label: str | None = None) -> tuple[str, ApiKey]:
        """A new key for the tenant (the secret returned once, stored hashed), at most
        KEYS_MAX; its item and the tenant's list in one transaction."""
        if label is not None and len(label) > LABEL_MAX:
            raise InvalidInput("label too long", [FieldError("label", f"at most {LABEL_MAX}")])
        api_key = KEY_PREFIX + secrets.token_urlsafe(32)
        made: list[ApiKey] = []

        def attempt() -> None:
            tenant = self._get_item(name)
            keys = _keys(tenant.api_keys)
            _check_room(keys)
            digest = key_hash(api_key)
            new = ApiKey(key_id_of(api_key, digest), digest, now_ms, label)
            listed = _distinct([*keys, new])  # its id: the tenant's only
            item = self.models.api_key(
                f"KEY#{new.digest}", tenant=name, key_id=listed[-1].key_id, created_ms=now_ms,
                label=label,
            )  # fmt: skip
            self._transact_keys(tenant, listed, save=item)
            made[:] = listed[-1:]

        _again_while_changing(attempt)
        return api_key, made[0]

    def revoke_key_id(self, name: str, key_id: str) -> None:
        """Revoke one of the tenant's keys by its id: never its last one (InvalidState)."""

        def attempt() -> None:
            tenant = self._get_item(name)
            keys = _keys(tenant.api_keys)
            gone = next((k for k in keys if k.key_id == key_id), None)
            if gone is None:
                raise NotFound(f"no key {key_id!r}")
            if len(keys) == 1:
                raise InvalidState("the tenant's last key cannot be revoked: create another first")
            key_item = self.models.api_key(f"KEY#{gone.digest}", tenant=name, key_id=key_id,
                                           created_ms=gone.created_ms)  # fmt: skip
            self._transact_keys(tenant, [k for k in keys if k is not gone], delete=key_item)

        _again_while_changing(attempt)

    def _transact_keys(
        self,
        tenant: TenantItem,
        keys: list[ApiKey],
        save: ApiKeyItem | None = None,
        delete: ApiKeyItem | None = None,
        existing: ApiKeyItem | None = None,
    ) -> None:
        actions, condition = self._list_write(tenant, keys)
        try:
            with TransactWrite(connection=tenant._get_connection().connection) as tx:
                tx.update(tenant, actions=actions, condition=condition)
                if save is not None:
                    tx.save(save, condition=self.models.api_key.pk.does_not_exist())
                if delete is not None:  # and counted with it: one commit, or neither
                    tx.delete(delete)
                    self._count_revocation(tx)
                if existing is not None:
                    tx.condition_check(
                        self.models.api_key, existing.pk, condition=self.models.api_key.pk.exists()
                    )
        except TransactWriteError as exc:
            raise ConcurrentUpdate("the tenant's keys changed meanwhile; retry") from exc

    def _count_revocation(self, tx: TransactWrite) -> None:
        """In the revoking transaction: a key is never gone while the count stands still
        (every sandbox would keep trusting it for AUTH_CACHE_MS)."""
        tx.update(
            self.models.revocations(REVOCATIONS_PK),
            actions=[self.models.revocations.revoked.add(1)],
        )

    def revocation_count(self) -> int:
        """How many keys were ever revoked (it only grows)."""
        try:
            return int(self.models.revocations.get(REVOCATIONS_PK, consistent_read=True).revoked)
        except self.models.revocations.DoesNotExist:
            return 0

    def add_key(self, name: str, now_ms: int, api_key: str | None = None) -> str:
        """Register a key for the tenant (a new random one unless given) and return it: its
        item and the tenant's list in one transaction, at most KEYS_MAX (InvalidState), as
        ``create_key``. A key is never moved to another tenant (InvalidState), and a key the
        tenant has already changes nothing (``tenant create`` stays idempotent; one from
        before the list is listed, as its first use would)."""
        if self.get_tenant(name) is None:
            raise NotFound(f"no tenant {name!r}")
        api_key = api_key or KEY_PREFIX + secrets.token_urlsafe(32)
        digest = key_hash(api_key)

        def attempt() -> None:
            tenant = self._get_item(name)
            keys = _keys(tenant.api_keys)
            if any(k.digest == digest for k in keys):
                return
            try:
                held = self.models.api_key.get(f"KEY#{digest}", consistent_read=True)
            except self.models.api_key.DoesNotExist:
                held = None
            if held is not None and held.tenant != name:
                raise InvalidState(
                    "this API key is already registered to another tenant; a key is never "
                    "reassigned (revoke it first, or register a new one)"
                )
            if held is not None:  # the tenant's, from before the list: listed, as on first use
                old = ApiKey(held.key_id, digest, int(held.created_ms), held.label)
                self._transact_keys(tenant, [*keys, old], existing=held)
                return
            _check_room(keys)
            listed = _distinct([*keys, ApiKey(key_id_of(api_key, digest), digest, now_ms)])
            item = self.models.api_key(f"KEY#{digest}", tenant=name, key_id=listed[-1].key_id,
                                       created_ms=now_ms)  # fmt: skip
            self._transact_keys(tenant, listed, save=item)

        _again_while_changing(attempt)
        return api_key

    def revoke_key(self, api_key: str) -> bool:
        """Delete a key and count the revocation (what tells every api sandbox to forget the keys
        it remembers); returns False if it was unknown. The delete and the count are one
        transaction: a sandbox that sees the new count and looks the key up again finds it
        gone."""
        digest = key_hash(api_key)
        try:
            key = self.models.api_key.get(f"KEY#{digest}", consistent_read=True)
            with TransactWrite(connection=key._get_connection().connection) as tx:
                tx.delete(key, condition=self.models.api_key.pk.exists())
                self._count_revocation(tx)
        except self.models.api_key.DoesNotExist:
            return False
        except TransactWriteError as exc:
            reasons = [r.code for r in exc.cancellation_reasons or [] if r is not None]
            if "ConditionalCheckFailed" not in reasons:
                raise
            return False  # revoked meanwhile by another
        try:  # off the tenant's list too (an operator may revoke its last key)
            tenant = self._get_item(key.tenant)
            self._relist(tenant, [k for k in _keys(tenant.api_keys) if k.digest != digest])
        except (NotFound, UpdateError):
            pass
        return True


KEY_WRITE_TRIES = 5


def _check_room(keys: list[ApiKey]) -> None:
    """A new key joins the tenant's list only while it holds fewer than KEYS_MAX."""
    if len(keys) >= KEYS_MAX:
        raise InvalidState(f"a tenant keeps at most {KEYS_MAX} keys: revoke one first")


def _again_while_changing(attempt: Callable[[], None]) -> None:
    """Run a read-modify-write of the tenant's key list again while another write to it
    (a create, a revoke, a first use that lists an old key) came between its read and its
    write: only the list's own rules (at most 10, never the last) refuse it."""
    for _ in range(KEY_WRITE_TRIES - 1):
        try:
            return attempt()
        except ConcurrentUpdate:
            continue
    return attempt()
