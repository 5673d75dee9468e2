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
