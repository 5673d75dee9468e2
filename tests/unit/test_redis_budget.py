"""A Redis call ends within REDIS_TIMEOUT_S, its retries included (cluster redirections and
failovers too): the trigger plans its deadline with that budget."""

from __future__ import annotations

import pytest

from timers.engine.trigger import REDIS_CALL_MS
from timers.runtime import REDIS_RETRIES, REDIS_TIMEOUT_S, redis_attempt_timeout_s


@pytest.mark.parametrize("cluster", [False, True])
def test_every_attempt_and_backoff_fit_the_budget(cluster: bool) -> None:
    retries, cap = REDIS_RETRIES[cluster]
    timeout = redis_attempt_timeout_s(cluster)
    assert timeout >= 0.25  # still far above a healthy call (~1 ms in one AZ)
    assert (retries + 1) * timeout + retries * cap <= REDIS_TIMEOUT_S + 1e-9


def test_the_trigger_plans_with_the_clients_budget() -> None:
    assert REDIS_CALL_MS >= REDIS_TIMEOUT_S * 1000


def test_the_triggers_timer_reads_and_checkpoints_fit_the_claim_budget() -> None:
    """The trigger's pynamodb models (its timers' reads and checkpoint writes) time out as its
    claim client does: one attempt of 0.5 s to connect and 3 s to read, within DYNAMO_CALL_MS
    (pynamodb's defaults - 3 retries of up to 15 + 30 s - would outlast the run)."""
    from timers.engine.claim import DYNAMO_CALL_MS
    from timers.runtime import CLAIM_CONFIG, CLAIM_TIMEOUTS
    from timers.store.timers_table import TimerStore

    meta = TimerStore("timers", **CLAIM_TIMEOUTS).models.timer.Meta
    attempts = 1 + meta.max_retry_attempts
    seconds = meta.connect_timeout_seconds + meta.read_timeout_seconds
    assert attempts * seconds * 1000 <= DYNAMO_CALL_MS
    assert (meta.connect_timeout_seconds, meta.read_timeout_seconds) == (
        CLAIM_CONFIG.connect_timeout,
        CLAIM_CONFIG.read_timeout,
    )
