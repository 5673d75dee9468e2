"""Tenants and their API keys (DynamoDB, one table keyed by ``pk``).

- ``TENANT#<name>``: the tenant, its callback queue and the extra queues it may target.
  It also holds the tenant's webhook signing secrets (``whsec_...``, newest first; during a
  rotation the previous one signs too until its ``until``).
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
  (at most once a second, and only when it is about to trust a remembered key) and forgets
  every key it remembers when it moved: a revoked key is refused within a second everywhere.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pynamodb.attributes import NumberAttribute, UnicodeAttribute, UnicodeSetAttribute
from pynamodb.exceptions import TransactWriteError, UpdateError
from pynamodb.models import Model
from pynamodb.transactions import TransactWrite

from timers.adapters.dynamodb import bound_model
from timers.core.errors import (
    ConcurrentUpdate,
    FieldError,
    InvalidInput,
    InvalidState,
    NotFound,
    RateLimited,
)
from timers.core.timer import TENANT_NAME
from timers.core.webhooks import new_secret

DEFAULT_RATE_LIMIT_PER_S = 50
DEFAULT_SPREAD = 8
"""Partitions a tenant's timers share (timers.engine.entries.partition_for): one tenant's burst
occupies at most this many Redis buckets and claim items per second. A tenant whose bursts
exceed ~50 timers per partition and second (a claim write's chunk) gets more."""
KEY_PREFIX = "tk_"
ROTATION_WINDOW_MS = 24 * 3_600_000
"""How long a rotated-out webhook secret keeps signing: consumers switch within it."""
AUTH_CACHE_MS = 30_000
"""An api sandbox remembers a key's tenant this long (a tenant's changes reach it within it)."""
REVOCATION_CHECK_MS = 1_000
"""How often a sandbox that trusts remembered keys reads the revocation count: a revoked key
is refused within this, in every sandbox (one consistent read, 1 RRU, per busy sandbox-second)."""
REVOCATIONS_PK = "REVOCATIONS"
AUTH_CACHE_SIZE = 10_000
"""Keys remembered per api sandbox, of each kind (naming a tenant, naming none)."""
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


def _hash(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def _tenant_pk(name: str) -> str:
    return f"TENANT#{name}"


def _to_tenant(item: TenantItem) -> Tenant:
    return Tenant(
        name=item.name,
        callback_queue_url=item.callback_queue_url,
        allowed_queue_urls=frozenset(item.allowed_queue_urls or ()),
        rate_limit_per_s=int(item.rate_limit_per_s),
        spread=int(item.spread),
        webhook_secrets=_secrets(item.webhook_secrets),
        created_ms=int(item.created_ms or 0),
    )


def _secrets(text: str | None) -> tuple[tuple[str, int | None], ...]:
    if not text:
        return ()
    return tuple((str(e["s"]), e.get("until")) for e in json.loads(text))


def _secrets_json(entries: tuple[tuple[str, int | None], ...]) -> str:
    return json.dumps([{"s": s, "until": until} for s, until in entries])


def validate_name(name: str) -> None:
    if not TENANT_NAME.fullmatch(name):
        raise InvalidInput(
            "invalid tenant name",
            [FieldError("name", "1-40 characters: lower-case letters, digits and '-'")],
        )


class TenantStore:
    """Tenants, their keys and the revocation count, in one tenants table."""

    def __init__(self, table: str, clock: Callable[[], int] | None = None) -> None:
        self.models = models_for(table)
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)

    def signing_secrets(self, name: str, now_ms: int) -> list[str]:
        """The secrets that sign a tenant's webhooks now (none: no such tenant)."""
        tenant = self.get_tenant(name)
        return tenant.signing_secrets(now_ms) if tenant else []

    def get_tenant(self, name: str) -> Tenant | None:
        try:
            return _to_tenant(self.models.tenant.get(_tenant_pk(name), consistent_read=True))
        except self.models.tenant.DoesNotExist:
            return None

    def authenticate(self, api_key: str | None) -> Tenant | None:
        """The tenant an API key belongs to, or None for a missing, unknown or revoked key."""
        if not api_key:
            return None
        try:
            # consistent: a replica's stale "still there" just after a revocation would be
            # remembered by this sandbox after it read the moved count
            key = self.models.api_key.get(f"KEY#{_hash(api_key)}", consistent_read=True)
        except self.models.api_key.DoesNotExist:
            return None
        try:
            item = self.models.tenant.get(_tenant_pk(key.tenant), consistent_read=True)
        except self.models.tenant.DoesNotExist:
            return None
        self._note_use(key, item)
        return _to_tenant(item)

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
            digest = _hash(api_key)
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
            _tenant_pk(name),
            name=name,
            callback_queue_url=callback_queue_url,
            created_ms=now_ms,
            webhook_secrets=_secrets_json(secret),
        ).save(condition=self.models.tenant.pk.does_not_exist())
        return Tenant(name=name, callback_queue_url=callback_queue_url, webhook_secrets=secret,
                      created_ms=now_ms)  # fmt: skip

    def rotate_secret(self, name: str, now_ms: int, window_ms: int = ROTATION_WINDOW_MS) -> Tenant:
        """A new current webhook secret; the previous one keeps signing for ``window_ms`` (both
        signatures are sent meanwhile), older ones stop. Conditional on the secrets read, so two
        rotations at once cannot lose one."""
        item = self._get_item(name)
        before = item.webhook_secrets
        current = _secrets(before)
        kept = [(s, now_ms + window_ms) for s, until in current[:1] if window_ms > 0]
        entries = ((new_secret(), None), *kept)
        held = self.models.tenant.webhook_secrets
        condition = held.does_not_exist() if before is None else held == before
        item.update(actions=[held.set(_secrets_json(entries))], condition=condition)
        return _to_tenant(item)

    def add_key(self, name: str, now_ms: int, api_key: str | None = None) -> str:
        """Register a key for the tenant (a new random one unless given) and return it: its
        item and the tenant's list in one transaction, at most KEYS_MAX (InvalidState), as
        ``create_key``. A key is never moved to another tenant (InvalidState), and a key the
        tenant has already changes nothing (``tenant create`` stays idempotent; one from
        before the list is listed, as its first use would)."""
        if self.get_tenant(name) is None:
            raise NotFound(f"no tenant {name!r}")
        api_key = api_key or KEY_PREFIX + secrets.token_urlsafe(32)
        digest = _hash(api_key)

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
        digest = _hash(api_key)
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

    def allow_queue(self, name: str, queue_url: str) -> Tenant:
        """Let the tenant target an extra queue (it must also be inside the trigger's IAM scope)."""
        item = self._get_item(name)
        item.update(actions=[self.models.tenant.allowed_queue_urls.add({queue_url})])
        return _to_tenant(item)

    def set_spread(self, name: str, spread: int) -> Tenant:
        """How many buckets the tenant's *new* timers share (existing timers keep theirs)."""
        if not 1 <= spread <= 4_096:
            raise InvalidInput("invalid spread", [FieldError("spread", "from 1 to 4096")])
        item = self._get_item(name)
        item.update(actions=[self.models.tenant.spread.set(spread)])
        return _to_tenant(item)

    def set_rate_limit(self, name: str, per_second: int) -> Tenant:
        """The tenant's API request rate (requests per second, all its keys together)."""
        if not 1 <= per_second <= 1_000_000:
            raise InvalidInput("invalid rate", [FieldError("per_second", "from 1 to 1000000")])
        item = self._get_item(name)
        item.update(actions=[self.models.tenant.rate_limit_per_s.set(per_second)])
        return _to_tenant(item)

    def disallow_queue(self, name: str, queue_url: str) -> Tenant:
        item = self._get_item(name)
        item.update(actions=[self.models.tenant.allowed_queue_urls.delete({queue_url})])
        return _to_tenant(item)

    def _get_item(self, name: str) -> TenantItem:
        try:
            return self.models.tenant.get(_tenant_pk(name), consistent_read=True)
        except self.models.tenant.DoesNotExist:
            raise NotFound(f"no tenant {name!r}") from None


class CachedAuthenticator:
    """``lookup`` (a TenantStore's ``authenticate``) with a per-instance memory of recent
    answers (hashed keys only), so a busy api reads the tenants table about once per key per
    AUTH_CACHE_MS, not per request. Before it trusts a remembered key it reads the revocation
    count (``revocations``, the store's ``revocation_count``), at most once per
    REVOCATION_CHECK_MS; when the count moved it forgets every key it remembered, so a revoked
    key is refused within that, whichever process revoked it.

    Keys that name a tenant and keys that do not are remembered apart, each bounded, oldest
    out first: a flood of made-up keys pushes out only made-up keys. A key not remembered costs
    a read of the tenants table, so it is looked up only when ``may_look_up()`` allows (the api
    passes its caller's address's rate); otherwise RateLimited.
    """

    def __init__(
        self,
        clock: Callable[[], int],
        lookup: Callable[[str | None], Tenant | None],
        revocations: Callable[[], int],
        ttl_ms: int = AUTH_CACHE_MS,
        size: int = AUTH_CACHE_SIZE,
    ) -> None:
        self._clock = clock
        self._lookup = lookup
        self._ttl_ms = ttl_ms
        self._size = size
        self._revocations = revocations
        self._revoked: int | None = None  # the count last read; None: never read
        self._revoked_read_ms: int | None = None
        self._known: OrderedDict[str, tuple[int, Tenant]] = OrderedDict()
        self._unknown: OrderedDict[str, int] = OrderedDict()

    def __call__(
        self, api_key: str | None, may_look_up: Callable[[], bool] = lambda: True
    ) -> Tenant | None:
        if not api_key:
            return None
        digest, now = _hash(api_key), self._clock()
        if digest in self._known:
            self._forget_if_revoked(now)
        if (known := self._known.get(digest)) and now - known[0] < self._ttl_ms:
            return known[1]
        if (unknown := self._unknown.get(digest)) is not None and now - unknown < self._ttl_ms:
            return None
        if not may_look_up():
            raise RateLimited("too many new API keys from this address; retry shortly")
        if self._revoked is None:
            # Read before the first lookup: a revocation after it moves the count this saw.
            self._revoked, self._revoked_read_ms = self._revocations(), now
        tenant = self._lookup(api_key)
        if tenant is None:
            self._remember(self._unknown, digest, now)
            self._known.pop(digest, None)  # revoked
        else:
            self._remember(self._known, digest, (now, tenant))
            self._unknown.pop(digest, None)
        return tenant

    def _forget_if_revoked(self, now: int) -> None:
        """Forget every remembered key if a key was revoked since the count was last read."""
        last = self._revoked_read_ms
        if last is not None and now - last < REVOCATION_CHECK_MS:
            return
        count = self._revocations()
        if count != self._revoked:
            self._known.clear()
        self._revoked, self._revoked_read_ms = count, now

    def _remember(self, memory: OrderedDict[str, Any], digest: str, value: Any) -> None:
        memory[digest] = value
        memory.move_to_end(digest)
        while len(memory) > self._size:
            memory.popitem(last=False)


def summary(tenant: Tenant) -> dict[str, Any]:
    return {
        "tenant": tenant.name,
        "callback_queue_url": tenant.callback_queue_url,
        "webhook_secret": tenant.webhook_secret,
    }


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
