"""The cost benchmark's own arithmetic: idle subtraction, cold starts, targets, custom metrics."""

from __future__ import annotations

import pytest

from bench import cost
from bench.cost import ASSUMPTIONS, PRICES, emf_metrics, fire_dollars, memory_gb, merged
from bench.cost_stack import (
    SANDBOX_IDLE_MS,
    IdleModel,
    Sandboxes,
    Window,
    clock_sleep,
    retention_check_in_constant_time,
)
from bench.durations import cpu_fit
from bench.meter import Meter
from bench.report import targets_table
from tests.support.clock import FakeClock


def test_a_sandbox_is_warm_within_the_idle_time_and_cold_after_it() -> None:
    pool = Sandboxes(0)
    assert pool.start(SANDBOX_IDLE_MS) == 0
    assert pool.start(2 * SANDBOX_IDLE_MS + 1) == 1


def test_concurrent_invocations_need_a_sandbox_each() -> None:
    pool = Sandboxes(0)
    assert pool.start(1_000, 3) == 2  # one warm, two cold
    assert pool.start(2_000, 3) == 0  # all three warm now
    assert pool.start(2_000 + SANDBOX_IDLE_MS + 1, 1) == 1


def test_a_window_subtracts_the_idle_work_of_its_minutes_and_of_each_poll() -> None:
    idle = IdleModel(minute={"dynamodb.rru": 16.0, "lambda.migrator": 1.0},
                     poll={"redis.commands": 16.0})  # fmt: skip
    counts = {"minutes": 2, "fanout.polls.-": 10, "fires": 5, "dynamodb.rru": 40.0,
              "lambda.migrator": 2, "redis.commands": 200.0}  # fmt: skip
    added = Window(2, counts).minus(idle)
    assert added["dynamodb.rru"] == 40 - 32
    assert added["lambda.migrator"] == 0
    assert added["redis.commands"] == 200 - 160
    assert added["fires"] == 5  # kept, never subtracted
    assert not any(k.startswith("fanout.polls.") for k in added)


def test_every_function_s_custom_metrics_are_counted() -> None:
    metrics = emf_metrics()
    assert len(metrics["migrator"]) == 5 and len(metrics["fanout"]) == 4
    assert {"FireLagMs", "FiresLate", "ClaimsTakenOver", "InvokeDelayMs"} <= set(metrics["trigger"])
    levels = [m for m in metrics["trigger"] if m.startswith("FiresLag_")]  # one per level
    assert len(levels) == 6 and len(metrics["trigger"]) == 16
    assert "Webhooks_delivered" in metrics["delivery"]
    assert metrics["api"] == []


def test_an_idle_run_publishes_only_its_heartbeats() -> None:
    """The idle month pays for what a run with nothing to do publishes: counts of zero are
    left out, but for one heartbeat each of the fan-out and the migrator."""
    idle = emf_metrics(idle=True)
    assert idle["fanout"] == ["FanoutInvocations"] and idle["migrator"] == ["MigratorRead"]
    assert idle["trigger"] == ["InvokeDelayMs"] and idle["delivery"] == []


def test_a_traced_create_and_a_posted_webhook_are_priced() -> None:
    per = {"xray.traces.api": 1.0, "delivery.posts": 1.0, "delivery.post_bytes": 400.0}
    dollars = fire_dollars(per, memory_gb())
    assert dollars["xray"] == 5.0
    assert dollars["internet_egress"] == round((400 + 600) / 1e9 * 0.09 * 1e6, 4)


def test_the_targets_table_says_met_or_missed_and_by_how_much() -> None:
    cost = {
        "usd_per_million_fires": {"recurring_batched": 0.29, "one_shot_ahead": 3.0, "x": 1.0},
        "usd_per_idle_month": 47.0,
        "targets_usd_per_million": {"recurring_batched": 0.30, "one_shot_ahead": 2.50,
                                    "idle_month": 35.0},
    }  # fmt: skip
    table = targets_table(cost)
    assert "| recurring_batched | $0.290 | ≤ $0.30 | met, $0.01 under |" in table
    assert "| one_shot_ahead | $3.000 | ≤ $2.50 | **missed** by $0.50 (20%) |" in table
    assert "| x | $1.000 | - | no target |" in table
    assert "| idle_month | $47.00/month | ≤ $35.00/month | **missed** by $12.00 (34%) |" in table


def test_a_partial_run_replaces_its_scenarios_and_keeps_the_others() -> None:
    def section(prices: str, **usd: float) -> dict[str, object]:
        checks = {"every_fire_delivered": True, "duplicates": 0, "early": 0,
                  "idle_model_residual_30_sparse_minutes": {g: {} for g in usd}}  # fmt: skip
        return {"usd_per_million_fires": usd, "wru_per_fire": usd,
                "scenarios": {k: {"usd": v} for k, v in usd.items()}, "checks": checks,
                "prices": prices}  # fmt: skip

    last = section("old", a=1.0, b=2.0)
    last["checks"]["duplicates"] = 3  # type: ignore[index]
    part = section("new", b=0.5)
    part["checks"]["every_fire_delivered"] = False  # type: ignore[index]
    whole = merged(last, part)
    assert whole["usd_per_million_fires"] == {"a": 1.0, "b": 0.5} == whole["wru_per_fire"]
    assert whole["scenarios"] == {"a": {"usd": 1.0}, "b": {"usd": 0.5}}
    assert whole["prices"] == "new"
    assert whole["checks"]["every_fire_delivered"] is False  # failed in either: failed
    assert whole["checks"]["duplicates"] == 3  # never hidden
    assert set(whole["checks"]["idle_model_residual_30_sparse_minutes"]) == {"a", "b"}


def test_a_measured_trigger_is_billed_its_cpu_and_each_of_its_calls_at_aws_latency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fit = {"per_run": 30.0, "per_fire": 2.0, "runs": 9}
    monkeypatch.setattr(
        cost, "last_results", lambda _: {"all": {"TriggerFunction": {"cpu_ms_fit": fit}}}
    )
    per = {"lambda.trigger": 1.0, "calls.trigger.dynamodb": 2.0, "calls.trigger.sqs": 1.0,
           "calls.trigger.redis": 4.0, "calls.migrator.dynamodb": 100.0,
           "waited.trigger": 180.0}  # fmt: skip
    mem = memory_gb()
    armed = 180 - ASSUMPTIONS["trigger_invoke_ms"]  # the invoke's part of the lead is not its
    billed_ms = 30 + armed + 2 + 2 * 5 + 1 * 10 + 4 * 0.5
    expected = billed_ms / 1000 * mem["trigger"] * PRICES["lambda_gb_second_arm64"]["usd"]
    assert fire_dollars(per, mem)["lambda_duration"] == round(expected * 1e6, 4)


def test_a_function_not_measured_keeps_its_stated_wall_time_and_no_waits_are_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cost, "last_results", lambda _: {})
    per = {"lambda.api": 1.0, "calls.api.dynamodb": 3.0}
    mem = memory_gb()
    gb_s = (ASSUMPTIONS["api_ms"] * mem["api"]
            + ASSUMPTIONS["trigger_per_fire_ms"] * mem["trigger"]) / 1000  # fmt: skip
    expected = gb_s * PRICES["lambda_gb_second_arm64"]["usd"]
    assert fire_dollars(per, mem)["lambda_duration"] == round(expected * 1e6, 4)


def test_a_call_counts_as_the_running_function_s_own() -> None:
    meter = Meter()
    meter.add("dynamodb.calls.PutItem")  # no handler running: the stack's own setup
    meter.scope = "trigger"
    meter.add("dynamodb.calls.TransactWriteItems")
    meter.add("sqs.calls.SendMessageBatch")
    meter.add("dynamodb.wru.table", 3)  # units are not calls
    counts = meter.snapshot()
    assert counts["calls.trigger.dynamodb"] == 1 and counts["calls.trigger.sqs"] == 1
    assert counts["dynamodb.calls.PutItem"] == 1 and "calls.trigger.dynamodb.wru" not in counts
    assert not [k for k in counts if k.startswith("calls.") and ".wru" in k]


def test_a_run_is_billed_the_waits_it_made_on_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy bucket's run that waited between its sends for two seconds is billed them; an
    empty run's and the invoke's part of a lead are not."""
    monkeypatch.setattr(cost, "last_results", lambda _: {})
    mem = memory_gb()

    def trigger_usd(per: dict[str, float]) -> float:
        return fire_dollars(per, mem)["lambda_duration"]

    lone = trigger_usd({"lambda.trigger": 1.0, "waited.trigger": 200.0})
    busy = trigger_usd({"lambda.trigger": 1.0, "waited.trigger": 2_000.0})
    per_ms = mem["trigger"] / 1000 * PRICES["lambda_gb_second_arm64"]["usd"] * 1e6
    assert busy - lone == pytest.approx(1_800 * per_ms, abs=1e-4)
    short = {"lambda.trigger": 1.0, "waited.trigger": 20.0}  # less than the invoke's part
    assert trigger_usd(short) == trigger_usd({"lambda.trigger": 1.0})
    empty = {"lambda.trigger": 1.0, "lambda.trigger.empty": 1.0, "waited.trigger": 30.0}
    assert trigger_usd(empty) - trigger_usd({"lambda.trigger": 1.0}) == pytest.approx(
        30 * per_ms, abs=1e-4
    )


def test_a_handler_s_sleep_on_the_cost_stack_moves_the_clock_and_counts_as_its_wait() -> None:
    meter, clock = Meter(), FakeClock(1_000)
    sleep = clock_sleep(meter, clock)
    sleep(0.05)  # the fan-out's own pacing, no handler running: not a function's wait
    meter.scope = "trigger"
    sleep(0.1201)
    assert clock() == 1_000 + 50 + 121
    assert meter.snapshot() == {"waited.trigger": 121}


def test_a_trigger_run_s_cpu_is_fitted_per_run_and_per_fire() -> None:
    runs = [{"enqueued": n, "cpu_ms": 20 + 1.5 * n, "init_ms": None} for n in (1, 2, 10, 90)]
    assert cpu_fit(runs) == {"per_run": 20.0, "per_fire": 1.5, "runs": 4}
    assert cpu_fit([{"enqueued": 3, "cpu_ms": 40.0, "init_ms": None}] * 5) is None


def test_the_cost_stack_s_retention_check_keeps_moto_s_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The constant-time check the cost stack puts in moto's place: a message within the
    queue's retention period is received, one past it is not."""
    import time

    import boto3
    from moto import mock_aws
    from moto.sqs.models import Message, SQSBackend, sqs_backends

    check = "is_message_valid_based_on_retention_period"
    monkeypatch.setattr(SQSBackend, check, getattr(SQSBackend, check))  # moto's, put back after
    retention_check_in_constant_time()
    with mock_aws():
        url = boto3.client("sqs", region_name="us-east-1").create_queue(
            QueueName="q", Attributes={"MessageRetentionPeriod": "60"}
        )["QueueUrl"]
        backend = sqs_backends["123456789012"]["us-east-1"]
        message = Message("m", "body")
        message.sent_timestamp = int(time.time() * 1000) - 30_000
        assert backend.is_message_valid_based_on_retention_period("q", message)
        message.sent_timestamp -= 31_000
        assert not backend.is_message_valid_based_on_retention_period("q", message)
        assert url.endswith("/q")
