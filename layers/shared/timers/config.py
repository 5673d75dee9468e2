"""The one typed configuration of every function, read from the environment once, at the
boundary, and validated: a bad value fails the cold start with one line naming it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from timers.core.numbers import is_ascii_digits
from timers.engine.wake import WAKE_SHARDS

LOCAL_ONLY = frozenset({"timers_allow_loopback_targets", "timers_local_stack"})
"""Settings the deployed template must never set (tests/unit/test_template.py checks)."""
OPTIONAL = frozenset({"delivery_queue_url", "delivery_dlq_url", "delivery_redrive_queue_url"})
"""Settings an empty value may leave empty (functions that do not use them)."""
TRUE, FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """One line: the variable and what is wrong with it."""


@dataclass(frozen=True)
class Settings:
    timers_table: str = "timers"
    claims_table: str = "claims"
    wakeups_table: str = "wakeups"
    tenants_table: str = "tenants"
    idempotency_table: str = "idempotency"
    failed_fires_table: str = "failed_fires"  # each failure of an HTTP fire (timers.api.failures)
    groups_table: str = "groups"  # the tenants' groups (timers.api.groups_table)
    redis_url: str = "redis://127.0.0.1:6390/0"
    redis_cluster: bool = False
    bucket_count: int = 16
    lookahead_seconds: int = 120
    fire_retention_days: int = 30
    trigger_function_name: str = "trigger"
    trigger_concurrency: int = 128  # trigger runs that can run at once: the fan-out's budget
    migrator_function_name: str = "migrator"  # the fan-out asks it to restore a lost bucket
    tenant_queue_prefix: str = "timers-tenant-"
    delivery_queue_url: str = ""  # HTTP targets' fires go here (the delivery function's queue)
    delivery_dlq_url: str = ""  # where an undelivered fire's message ends
    delivery_redrive_queue_url: str = ""  # where SQS moves a message delivery kept failing on
    webhook_target_concurrency: int = 8  # POSTs in flight per tenant and origin, all sandboxes
    webhook_tenant_concurrency: int = 16  # POSTs in flight per tenant, all origins together
    # Loopback webhook targets (also over plain http): the local stack, for tests and demos.
    timers_allow_loopback_targets: bool = False
    # Set by `make run` (ops/local/stack.py) only: a refusal may name the local stack's own
    # settings (a loopback target: TIMERS_ALLOW_LOOPBACK_TARGETS). Nothing else depends on it.
    timers_local_stack: bool = False

    def __post_init__(self) -> None:
        if self.bucket_count < 1 or WAKE_SHARDS % self.bucket_count:
            raise ConfigError(f"BUCKET_COUNT={self.bucket_count}: must divide {WAKE_SHARDS}")
        for name in ("lookahead_seconds", "fire_retention_days", "webhook_target_concurrency",
                     "webhook_tenant_concurrency", "trigger_concurrency"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.upper()}={getattr(self, name)}: must be at least 1")
        if self.lookahead_seconds < 90:
            raise ConfigError("LOOKAHEAD_SECONDS: at least 90 (a migrator minute and its run)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Each field from its upper-case variable (TIMERS_TABLE...), else its default. A
        variable that is set must be valid: empty is an error unless the field may be empty."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(f.name.upper())
            if raw is None:
                continue
            values[f.name] = _parse(f.name, f.type, raw.strip())
        return cls(**values)  # type: ignore[arg-type]


def _parse(name: str, kind: object, raw: str) -> object:
    if not raw and name not in OPTIONAL:
        raise ConfigError(f"{name.upper()} is set but empty")
    if kind == "bool":
        if raw.lower() not in TRUE | FALSE:
            raise ConfigError(f"{name.upper()}={raw!r}: not a boolean (1/0, true/false)")
        return raw.lower() in TRUE
    if kind == "int":
        if not is_ascii_digits(raw.removeprefix("-")):
            raise ConfigError(f"{name.upper()}={raw!r}: not a whole number")
        return int(raw)
    return raw
