"""The one typed configuration of every function, read from the environment at the boundary."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

LOCAL_ONLY = frozenset({"timers_allow_loopback_targets"})
"""Settings the deployed template must never set (tests/unit/test_template.py checks)."""


@dataclass(frozen=True)
class Settings:
    timers_table: str = "timers"
    claims_table: str = "claims"
    wakeups_table: str = "wakeups"
    tenants_table: str = "tenants"
    idempotency_table: str = "idempotency"
    failed_fires_table: str = "failed_fires"  # each failure of an HTTP fire (timers.failures)
    redis_url: str = "redis://127.0.0.1:6390/0"
    redis_cluster: bool = False
    bucket_count: int = 64
    due_shards: int = 32
    lookahead_seconds: int = 120
    fire_retention_days: int = 30
    trigger_function_name: str = "trigger"
    tenant_queue_prefix: str = "timers-tenant-"
    delivery_queue_url: str = ""  # HTTP targets' fires go here (the delivery function's queue)
    delivery_dlq_url: str = ""  # where an undelivered fire's message ends
    # where SQS moves a message the delivery function kept failing on (to settle it)
    delivery_redrive_queue_url: str = ""
    webhook_target_concurrency: int = 8  # POSTs in flight per tenant and origin, all sandboxes
    webhook_tenant_concurrency: int = 16  # POSTs in flight per tenant, all origins together
    # Loopback webhook targets (also over plain http): the local stack, for tests and demos.
    # The deployed template never sets it.
    timers_allow_loopback_targets: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Each field from its upper-case environment variable (TIMERS_TABLE...), else default."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(f.name.upper())
            if raw is None or raw == "":
                continue
            if f.type == "bool":
                values[f.name] = raw.strip().lower() in {"1", "true", "yes", "on"}
            elif f.type == "int":
                values[f.name] = int(raw)
            else:
                values[f.name] = raw
        return cls(**values)  # type: ignore[arg-type]
