"""The trigger's lag metric is one value per fire, so CloudWatch's percentiles are per fire."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest

from functions.trigger import app as trigger_app
from timers.firing import TriggerReport


def busy(cls: type, **given: Any) -> Any:
    """A report with every int counter at 1: every ``if report.x`` that guards a metric runs."""
    values = {f.name: 1 for f in fields(cls) if f.type == "int"}
    return cls(**{**values, **given})


def emf_blocks(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if '"_aws"' in line]


def test_every_fire_is_one_lag_value_across_powertools_flushes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """p50/p99 of FireLagMs are per fire only if each fire's lag is one value (blocks hold 100)."""
    lags = [(i * 37) % 500 for i in range(250)]
    report = busy(TriggerReport, lags_ms=lags)
    trigger_app.emit_metrics(report, None)
    trigger_app.metrics.flush_metrics()
    blocks = emf_blocks(capsys.readouterr().out)
    values = [v for b in blocks for v in b.get("FireLagMs", [])]
    assert values == [float(lag) for lag in lags]
    assert max(len(b.get("FireLagMs", [])) for b in blocks) == 100
    assert [b["FiresEnqueued"] for b in blocks if "FiresEnqueued" in b] == [[1.0]]
