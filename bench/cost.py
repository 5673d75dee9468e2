"""Cost benchmark: what one fire, one create and one idle month cost at on-demand list prices.

``python -m bench.cost`` runs the deployed shape in-process on one injected clock
(``bench.cost_stack``), against moto (DynamoDB, SQS), a real redis-server and a local HTTP
endpoint: the api handler with HTTP API events, the migrator handler every minute, the fan-out
peeking at every bucket each POLL_MS, the trigger handler for every run it starts (armed runs
wait for due instants by advancing the clock) and the delivery function's handler for every
batch its SQS
event source would hand it. It counts what ``bench.meter`` describes - DynamoDB units by the
rules, SQS requests, Lambda invocations and cold starts, HTTP API requests, X-Ray traces by the
default sampling rule, Redis round trips and commands, bytes logged and POSTed - and prices
them (PRICES, ASSUMPTIONS). The scenarios are in ``bench.cost_scenarios``.

What is subtracted as idle: each scenario's window minus the idle work of the same minutes
and polls. Idle is profiled first, poll by poll: two dense minutes (as deployed) and twenty
in sparse mode. The long scenarios (hourly and daily crons, one-shots an hour ahead) run in
sparse mode: while Redis holds nothing due or leased within 2 s (read through an uncounted
admin connection: the earliest score of every bucket's ``due`` zset), the clock
jumps to the next minute boundary or 1 s before the earliest due member, whichever comes
first - so the migrator still runs every minute, and ``lambda.fanout`` is still counted once a
minute - and dense polling resumes near each fire. The window then subtracts each minute's
idle scheduled work and, for each poll it made, the idle cost of a poll: the idle polling a
real deployment does every POLL_MS is neither counted nor over-subtracted. The daily scenario
runs 2 days of minutes (~2,900 migrator runs) this way. Lambda durations: the CPU each
function measured on the local stack (``bench.durations``) plus each of its counted calls at
AWS's stated latency (``AWS_LATENCY_MS``); a function not measured yet keeps its stated wall
time (ASSUMPTIONS).
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

from ops.offline import use_fake_aws

use_fake_aws()  # never reach a real account, whatever the shell has: moto only
warnings.filterwarnings("ignore", message="No application metrics to publish")

from moto import mock_aws  # noqa: E402

from bench.common import last_results, progress, quick, write_results  # noqa: E402
from bench.cost_scenarios import GROUPS, Scenario, idle_model  # noqa: E402
from bench.cost_stack import (  # noqa: E402
    DELIVERY_POLLERS,
    SANDBOX_IDLE_MS,
    TRACED,
    Stack,
    endpoint_azs,
    platform_log_bytes,
)
from bench.meter import Meter, captured_stdout  # noqa: E402
from functions.fanout import app as fanout_app  # noqa: E402
from functions.migrator import app as migrator_app  # noqa: E402
from functions.trigger import app as trigger_app  # noqa: E402
from ops import template  # noqa: E402
from ops.redis_server import RedisServer  # noqa: E402
from tests.support.webhook_server import webhook_server  # noqa: E402
from timers.delivery.messages import VERDICTS  # noqa: E402
from timers.engine.fanout import MAX_RUN_MS, FanoutReport  # noqa: E402
from timers.engine.migrate import MigrationReport  # noqa: E402
from timers.engine.trigger import LEASE_LIMIT, TriggerReport  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MINUTES_PER_MONTH = 730 * 60  # AWS bills a month as 730 hours

PRICES_AS_OF = "2025-06"
"""The list prices as the author knew them then (DynamoDB on-demand as cut on 2024-11-01). The
benchmark has no internet access: verify on the pricing pages before quoting a figure. Those
marked ``verify`` were added without a page at hand."""


def _p(usd: float, per: str, as_of: str = PRICES_AS_OF) -> dict[str, Any]:
    return {"usd": usd, "per": per, "as_of": as_of}


PRICES: dict[str, dict[str, Any]] = {
    "dynamodb_write_request_unit": _p(0.625e-6, "WRU, on-demand", "2024-11-01"),
    "dynamodb_read_request_unit": _p(0.125e-6, "RRU, on-demand", "2024-11-01"),
    "dynamodb_storage_gb_month": _p(0.25, "GB-month, Standard table class"),
    "dynamodb_pitr_gb_month": _p(0.20, "GB-month of table size, continuous backups (verify)"),
    "sqs_request": _p(0.40e-6, "standard queue request (each 64 KB chunk)"),
    "lambda_request": _p(0.20e-6, "invocation"),
    "lambda_gb_second_arm64": _p(0.0000133334, "GB-second, arm64 (INIT too, since 2025-08-01)"),
    "api_gateway_http_request": _p(1.00e-6, "HTTP API request, per 512 KB (first 300 M a month)"),
    "elasticache_serverless_valkey_ecpu": _p(0.0023e-6, "ECPU"),
    "elasticache_serverless_valkey_storage_gb_hour": _p(0.084, "GB-hour, 100 MB minimum"),
    "vpc_interface_endpoint_hour": _p(0.01, "endpoint per AZ per hour"),
    "vpc_interface_endpoint_gb": _p(0.01, "GB processed"),
    "cloudwatch_logs_ingest_gb": _p(0.50, "GB ingested (standard log class)"),
    "cloudwatch_logs_storage_gb_month": _p(0.03, "GB-month archived (compressed; verify)"),
    "cloudwatch_custom_metric_month": _p(
        0.30, "metric-month, first 10,000, prorated by hour (verify)"
    ),
    "xray_trace_recorded": _p(5.00e-6, "trace recorded (verify)"),
    "data_transfer_out_internet_gb": _p(
        0.09, "GB out to the internet, after the first 100 GB a month (verify)"
    ),
    "eventbridge_scheduled_rule": _p(0.0, "scheduled rule invoking Lambda: no charge (verify)"),
}


def price(name: str) -> float:
    return float(PRICES[name]["usd"])


ASSUMPTIONS: dict[str, Any] = {
    "api_ms": 40,  # a warm create or batch of creates: validation, 1-3 DynamoDB calls, Redis
    "api_per_timer_ms": 1,  # each timer of a batch: build, serialize, its share of the writes
    "trigger_invoke_ms": 50,  # of an armed run's measured wait, spent on AWS in the invoke
    "trigger_base_ms": 40,  # clock sync, lease, one claim and one record write, finish
    "trigger_per_fire_ms": 1,  # its share of claims, SendMessageBatch and records
    "delivery_base_ms": 40,  # parse, secrets (cached a minute), a message's 6 DynamoDB calls
    "delivery_post_wait_ms": 150,  # the endpoint's answer (a batch's POSTs run in parallel)
    "migrator_ms": 1_000,
    "fanout_ms": MAX_RUN_MS,  # each run polls for 70 s and is billed for all of it
    "fanout_log_bytes_per_run": 700,  # its summary line and EMF block (not run by the bench)
    "init_ms": {"api": 900, "trigger": 700, "delivery": 700, "migrator": 700, "fanout": 700},
    "sandbox_idle_retire_s": SANDBOX_IDLE_MS // 1000,  # cold start after this long unused
    "sandbox_recycle_h": 2,  # a busy sandbox is still replaced about this often
    # START, END and REPORT of every invocation (400 bytes) unless PlatformLogLevel is WARN
    "lambda_platform_log_bytes": platform_log_bytes(),
    "api_access_log_bytes": 180,  # the HTTP API's access log line (template.yaml), with overhead
    "log_retention_months": 1,  # LogRetentionDays 30; storage priced uncompressed (an upper bound)
    "xray": f"traced as FunctionTracing's default says: {sorted(TRACED) or 'none'} (Active: "
    "1 request/s per function, then 5 %; the trigger, fan-out and delivery always pass through)",
    "ecpu_per_command": 1,  # each command executed, scripts' inner calls included
    "endpoint_bytes_per_sqs_byte": 2.0,  # request plus response and TLS/HTTP overhead
    "egress_overhead_bytes_per_post": 600,  # request line, TCP/TLS records, the answer's ACKs
    "interface_endpoints": 2,  # SQS, Lambda
    "availability_zones": endpoint_azs(),  # InterfaceEndpointAzs
    "delivery_event_sources": 2,  # the delivery queue and its redrive queue
    "pollers_per_event_source": DELIVERY_POLLERS,  # each long-polls (20 s) while idle
    "cache_min_storage_gb": 0.1,
    "fire_record_bytes": 80,  # a claim entry, kept FireRetentionDays: ~a month of fires stored
}


def memory_gb() -> dict[str, float]:
    """Each function's memory from template.yaml (Globals as the default)."""
    default = template.load().get("Globals", {}).get("Function", {}).get("MemorySize", 128)
    fns = template.resources("AWS::Serverless::Function")
    names = {"api": "ApiFunction", "migrator": "MigratorFunction", "fanout": "FanoutFunction"}
    names |= {"trigger": "TriggerFunction", "delivery": "DeliveryFunction"}
    return {k: int(fns[v].get("MemorySize", default)) / 1024 for k, v in names.items()}


LAGS = [12, 140, 300, 700, 1_500, 2_500, 0]
"""FireLagMs values that publish each count of the trigger: late (> 100 ms), every level."""


def emf_metrics(idle: bool = False) -> dict[str, list[str]]:
    """The custom metrics each function publishes (one dimension set, ``service``, so one
    metric per name): what its emit function adds for a run whose every counter is 1 - or, with
    ``idle``, 0 (a run with nothing to do: the idle month's metrics). The delivery function's
    are one per batch verdict; the api publishes none."""
    n = 0 if idle else 1

    def report(cls: type, **given: Any) -> Any:
        return cls(**{**{f.name: n for f in fields(cls) if f.type == "int"}, **given})

    runs = {
        # late fires and every accuracy level: each metric the trigger may publish
        "trigger": (trigger_app, report(TriggerReport, lags_ms=LAGS * n), (40,)),
        "fanout": (fanout_app, report(FanoutReport), ()),
        "migrator": (migrator_app, report(MigrationReport), ()),
    }
    out: dict[str, list[str]] = {"api": [], "delivery": [f"Webhooks_{v}" for v in VERDICTS] * n}
    for name, (app, run, args) in runs.items():
        app.emit_metrics(run, *args)
        out[name] = sorted(app.metrics.metric_set)
        app.metrics.clear_metrics()
    return dict(sorted(out.items()))


# ---------------------------------------------------------------- dollars

FUNCTIONS = ("api", "trigger", "delivery")  # invoked per fire or create (the rest: per minute)

AWS_LATENCY_MS = {"dynamodb": 5.0, "sqs": 10.0, "redis": 0.5}
"""Stated: one request's round trip inside a region (DynamoDB's single-digit milliseconds, an
SQS send, an ElastiCache command in the VPC). A function waits for each call the cost stack
counts as its own (``calls.<function>.<service>``), one after another: an upper bound, as
the trigger's record writes run in parallel."""

MEASURED = {  # bench.durations' keys: each function's CPU per warm invocation (p50)
    "api_ms": ("ApiFunction", "cpu_ms"),
    "delivery_base_ms": ("DeliveryFunction", "cpu_ms"),
}


def durations() -> dict[str, Any]:
    """What a function is billed for besides its waits: the CPU ``bench.durations`` measured
    (every label together) where it measured that function - the trigger's as a fit, per run
    and per fire - else the stated wall time of ASSUMPTIONS (waits included, none added)."""
    measured = last_results("durations").get("all", {})
    stated = ("trigger_base_ms", "trigger_per_fire_ms", "api_ms", "delivery_base_ms")
    out: dict[str, Any] = {k: ASSUMPTIONS[k] for k in stated} | {"measured": []}
    fit = measured.get("TriggerFunction", {}).get("cpu_ms_fit")
    if fit:
        out |= {"trigger_base_ms": fit["per_run"], "trigger_per_fire_ms": fit["per_fire"]}
        out["measured"].append("trigger")
    for key, (function, field) in MEASURED.items():
        p50 = measured.get(function, {}).get(field, {}).get("p50")
        if p50 is not None:
            out[key] = p50
            out["measured"].append(key.split("_")[0])
    return out


def waits_ms(per: dict[str, float], function: str, d: dict[str, Any]) -> float:
    """A function's calls at AWS's latency, where its CPU was measured (a stated figure
    already holds its waits)."""
    if function not in d["measured"]:
        return 0.0
    return sum(per.get(f"calls.{function}.{s}", 0) * ms for s, ms in AWS_LATENCY_MS.items())


def fire_dollars(
    per: dict[str, float], mem: dict[str, float], billed: dict[str, Any] | None = None
) -> dict[str, float]:
    """US$ per million fires, by line item (``billed``: ``durations()``, read once a run)."""
    a, d = ASSUMPTIONS, billed or durations()
    runs, api = per.get("lambda.trigger", 0), per.get("lambda.api", 0)
    delivery, empty = per.get("lambda.delivery", 0), per.get("lambda.trigger.empty", 0)
    # A run waits for its send instants on the stack's clock (``waited.trigger``), as long as
    # it really waited: a lone fire's lead, or a busy bucket's run between its sends for
    # seconds. On AWS the invoke takes the first part of that lead, before the handler runs.
    armed_ms = max(0.0, per.get("waited.trigger", 0) - (runs - empty) * a["trigger_invoke_ms"])
    trigger_s = (
        runs * d["trigger_base_ms"] + armed_ms + d["trigger_per_fire_ms"]
        + waits_ms(per, "trigger", d)
    ) / 1000  # fmt: skip
    api_s = (api * d["api_ms"] + per.get("creates", 0) * a["api_per_timer_ms"]
             + waits_ms(per, "api", d)) / 1000  # fmt: skip
    delivery_s = (delivery * (d["delivery_base_ms"] + a["delivery_post_wait_ms"])
                  + waits_ms(per, "delivery", d)) / 1000  # fmt: skip
    gb_s = trigger_s * mem["trigger"] + api_s * mem["api"] + delivery_s * mem["delivery"]
    init_gb_s = sum(per.get(f"lambda.cold.{f}", 0) * a["init_ms"][f] / 1000 * mem[f]
                    for f in FUNCTIONS)  # fmt: skip
    invocations = runs + api + delivery
    logs = (
        per.get("log.bytes", 0)
        + invocations * a["lambda_platform_log_bytes"]
        + per.get("apigw.requests", 0) * a["api_access_log_bytes"]
    )
    wru = (per.get("dynamodb.wru.table", 0) + per.get("dynamodb.wru.gsi", 0)
           + per.get("dynamodb.wru.checkpoint", 0))  # fmt: skip
    stored = a["fire_record_bytes"] / 1e9 + per.get("stored_gb_months", 0)  # GB-months
    in_vpc = per.get("sqs.payload_bytes", 0) - per.get("delivery.sqs.payload_bytes", 0)
    posts = per.get("delivery.posts", 0)
    lines = {
        "dynamodb_writes": wru * price("dynamodb_write_request_unit"),
        "dynamodb_reads": per.get("dynamodb.rru", 0) * price("dynamodb_read_request_unit"),
        "dynamodb_storage": stored * price("dynamodb_storage_gb_month"),
        "dynamodb_pitr": stored * price("dynamodb_pitr_gb_month"),
        "sqs": per.get("sqs.requests", 0) * price("sqs_request"),
        "lambda_requests": invocations * price("lambda_request"),
        "lambda_duration": gb_s * price("lambda_gb_second_arm64"),
        "lambda_init": init_gb_s * price("lambda_gb_second_arm64"),
        "api_gateway": per.get("apigw.requests", 0) * price("api_gateway_http_request"),
        "elasticache_ecpu": per.get("redis.commands", 0)
        * a["ecpu_per_command"]
        * price("elasticache_serverless_valkey_ecpu"),
        "cloudwatch_logs": logs / 1e9 * price("cloudwatch_logs_ingest_gb"),
        "cloudwatch_logs_storage": logs
        / 1e9
        * a["log_retention_months"]
        * price("cloudwatch_logs_storage_gb_month"),
        "xray": per.get("xray.traces.api", 0) * price("xray_trace_recorded"),
        "vpc_endpoint_data": in_vpc
        * a["endpoint_bytes_per_sqs_byte"]
        / 1e9
        * price("vpc_interface_endpoint_gb"),
        "internet_egress": (per.get("delivery.post_bytes", 0)
                            + posts * a["egress_overhead_bytes_per_post"])
        / 1e9
        * price("data_transfer_out_internet_gb"),
    }  # fmt: skip
    return {k: round(v * 1e6, 4) for k, v in lines.items()}


def idle_month(idle: dict[str, float], mem: dict[str, float]) -> dict[str, float]:
    """US$ per month of a deployment with nothing to fire, by line item."""
    a, mins = ASSUMPTIONS, MINUTES_PER_MONTH
    hours = mins / 60
    starts = idle.get("lambda.fanout", 0) + idle.get("lambda.migrator", 0)
    fanout_gb_s = idle.get("lambda.fanout", 0) * a["fanout_ms"] / 1000 * mem["fanout"]
    gb_s = fanout_gb_s + idle.get("lambda.migrator", 0) * a["migrator_ms"] / 1000 * mem["migrator"]
    # The fan-out's runs overlap (70 s a minute): two sandboxes; the migrator's one.
    recycled = hours / a["sandbox_recycle_h"]
    init_gb_s = recycled * sum(n * a["init_ms"][f] / 1000 * mem[f]
                               for f, n in (("fanout", 2), ("migrator", 1)))  # fmt: skip
    always = emf_metrics(idle=True)
    metrics = len(always["fanout"]) + len(always["migrator"])
    polls = a["delivery_event_sources"] * a["pollers_per_event_source"] * 3  # per minute
    logs = (idle.get("log.bytes", 0) + starts * a["lambda_platform_log_bytes"]
            + idle.get("lambda.fanout", 0) * a["fanout_log_bytes_per_run"])  # fmt: skip
    lines = {
        "vpc_interface_endpoints": a["interface_endpoints"]
        * a["availability_zones"]
        * hours
        * price("vpc_interface_endpoint_hour"),
        "elasticache_storage_minimum": a["cache_min_storage_gb"]
        * hours
        * price("elasticache_serverless_valkey_storage_gb_hour"),
        "elasticache_ecpu": idle.get("redis.commands", 0)
        * mins
        * a["ecpu_per_command"]
        * price("elasticache_serverless_valkey_ecpu"),
        "lambda_duration": gb_s * mins * price("lambda_gb_second_arm64"),
        "lambda_init_recycled_sandboxes": init_gb_s * price("lambda_gb_second_arm64"),
        "lambda_requests": starts * mins * price("lambda_request"),
        "dynamodb_reads": idle.get("dynamodb.rru", 0) * mins * price("dynamodb_read_request_unit"),
        "dynamodb_writes": (idle.get("dynamodb.wru.table", 0) + idle.get("dynamodb.wru.gsi", 0))
        * mins
        * price("dynamodb_write_request_unit"),
        "cloudwatch_logs": logs * mins / 1e9 * price("cloudwatch_logs_ingest_gb"),
        "cloudwatch_custom_metrics": metrics * price("cloudwatch_custom_metric_month"),
        "xray_migrator": idle.get("xray.traces.migrator", 0) * mins * price("xray_trace_recorded"),
        "delivery_queue_polling": polls * mins * price("sqs_request"),
    }
    return {k: round(v, 2) for k, v in lines.items()}


UNITS = {  # what the report shows per fire, from the counters
    "wru": ("dynamodb.wru.table", "dynamodb.wru.gsi", "dynamodb.wru.checkpoint"),
    "wru_claims": ("dynamodb.wru.ClaimsTable",),
    "wru_timers": ("dynamodb.wru.TimersTable",),
    "wru_wakeups": ("dynamodb.wru.WakeupsTable",),
    "wru_gsi": ("dynamodb.wru.gsi",),
    "wru_checkpoints_assumed": ("dynamodb.wru.checkpoint",),
    "wru_delivery": ("delivery.dynamodb.wru.table",),
    "wru_delivery_slots": ("delivery.slots.dynamodb.wru.table",),
    "wru_delivery_records": ("delivery.records.dynamodb.wru.table",),
    "rru": ("dynamodb.rru",),
    "sqs_requests": ("sqs.requests",),
    "sqs_requests_delivery": ("delivery.sqs.requests",),
    "lambda_trigger_runs": ("lambda.trigger",),
    "lambda_api_invocations": ("lambda.api",),
    "lambda_delivery_invocations": ("lambda.delivery",),
    "cold_starts": tuple(f"lambda.cold.{f}" for f in FUNCTIONS),
    "api_requests": ("apigw.requests",),
    "xray_traces": ("xray.traces.api",),
    "redis_round_trips": ("redis.round_trips",),
    "redis_commands": ("redis.commands",),
    "log_bytes": ("log.bytes",),
    "post_bytes": ("delivery.post_bytes",),
    "stored_kb_months": ("stored_gb_months",),
}
SCALE = {"stored_kb_months": 1e6}


def units(per: dict[str, float]) -> dict[str, float]:
    return {name: round(sum(per.get(k, 0) for k in keys) * SCALE.get(name, 1), 4)
            for name, keys in UNITS.items()}  # fmt: skip


TARGETS_USD_PER_MILLION = {
    "recurring_batched": 0.30,
    "cron_hourly_batched": 0.30,
    "one_shot_ahead_batch": 0.60,
    "recurring_alone": 1.40,
    "cron_daily_alone": 1.40,
    "one_shot": 2.50,
    "one_shot_ahead": 2.50,
    "webhook_batched": 1.00,
    "idle_month": 35.0,
    # the cost curve by load (one tenant): on the dot, and with a 60 s window
    "spread_0p1_w0": 3.50,
    "spread_1_w0": 3.00,
    "spread_10_w0": 2.50,
    "spread_100_w0": 1.40,
    "spread_0p1_w60": 1.40,
    "spread_1_w60": 0.60,
    "spread_10_w60": 0.40,
    "spread_100_w60": 0.30,
}
"""Targets per million fires (the create included for one-shots; idle: $/month). $1.40 is
EventBridge Scheduler with its SQS send."""


def scenario_result(sc: Scenario, mem: dict[str, float], billed: dict[str, Any]) -> dict[str, Any]:
    per = sc.per_fire()
    dollars = fire_dollars(per, mem, billed)
    return {
        "description": sc.description,
        "fires": sc.fires,
        "expected_fires": sc.expected_fires,
        **({} if sc.missing is None else {"missing_by_id": sc.missing}),
        "fires_per_trigger_run": round(sc.fires / max(1, sc.added.get("trigger.runs", 0)), 1),
        "units_per_fire": units(per),
        "usd_per_million_fires": round(sum(dollars.values()), 3),
        "usd_per_million_fires_by_item": dollars,
    }


PER_SCENARIO = ("usd_per_million_fires", "usd_per_million_ops", "wru_per_fire", "scenarios")
RESIDUALS = "idle_model_residual_30_sparse_minutes"  # per scenario group


def merged(last: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """A partial run's section laid over the last one: its scenarios replace theirs, the rest
    (idle month, prices) is the partial run's; a check fails if it failed in either (the
    replaced scenarios' old counts are not taken out: never hidden, maybe overstated)."""
    whole = {**last, **part}
    for key in PER_SCENARIO:
        whole[key] = {**last.get(key, {}), **part.get(key, {})}
    checks = last.get("checks", {})
    whole["checks"] = {
        **part["checks"],
        "every_fire_delivered": part["checks"]["every_fire_delivered"]
        and checks.get("every_fire_delivered", True),
        "duplicates": max(part["checks"]["duplicates"], checks.get("duplicates", 0)),
        "early": max(part["checks"]["early"], checks.get("early", 0)),
        RESIDUALS: {**checks.get(RESIDUALS, {}), **part["checks"][RESIDUALS]},
    }
    return whole


def main(argv: list[str] | None = None) -> int:
    short = quick()
    parser = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__)
    parser.add_argument("--burst", type=int, default=128 if short else 256)
    parser.add_argument("--only", nargs="*", help="scenario groups to run, the others' results "
                        "kept (default: all): "
                        + ", ".join(g.__name__ for g in GROUPS))  # fmt: skip
    args = parser.parse_args(argv)
    mem = memory_gb()
    progress("cost benchmark: moto + a real redis-server, the real handlers on one clock")
    server = RedisServer.start(new_session=True)
    scenarios: list[Scenario] = []
    idle: dict[str, float] = {}
    early = duplicates = 0
    residuals: dict[str, dict[str, float]] = {}
    try:
        with webhook_server() as endpoint, captured_stdout() as log_bytes:
            for group in GROUPS:  # each on a fresh deployment (see GROUPS)
                if args.only and group.__name__ not in args.only:
                    continue
                with mock_aws():
                    stack = Stack(Meter(), server.url, log_bytes, endpoint)
                    idle_per_minute, model, residuals[group.__name__] = idle_model(stack)
                    idle = idle or idle_per_minute  # the idle month: the first deployment's
                    scenarios += group(stack, args.burst, model)
                early += stack.early
                duplicates += sum(n - 1 for n in stack.received.values() if n > 1)
    finally:
        server.stop()
    results: dict[str, Any] = {}
    billed = durations()
    for sc in scenarios:
        results[sc.name] = scenario_result(sc, mem, billed)
        unit = "op" if sc.ops else "fire"
        progress(f"cost: {sc.name}: ${results[sc.name]['usd_per_million_fires']:.3f}/M {unit}s; "
                 f"{results[sc.name]['units_per_fire']}")  # fmt: skip
    idle_lines = idle_month(idle, mem)
    ops = {sc.name for sc in scenarios if sc.ops}
    per_m = {name: r["usd_per_million_fires"] for name, r in results.items() if name not in ops}
    section: dict[str, Any] = {
        "usd_per_million_fires": per_m,
        "usd_per_million_ops": {name: results[name]["usd_per_million_fires"] for name in ops},
        "wru_per_fire": {name: r["units_per_fire"]["wru"] for name, r in results.items()},
        "usd_per_idle_month": round(sum(idle_lines.values()), 2),
        "usd_per_idle_month_by_item": idle_lines,
        "units_per_idle_minute": units(idle),
        "scenarios": results,
        "targets_usd_per_million": TARGETS_USD_PER_MILLION,
        "compare_usd_per_million": {"eventbridge_scheduler": 1.40, "cloud_tasks": 0.80},
        "custom_metrics": emf_metrics(),
        "checks": {
            "every_fire_delivered": all(s.delivered for s in scenarios),
            "duplicates": duplicates,
            "early": early,
            RESIDUALS: residuals,
        },
        "prices": PRICES,
        "prices_as_of": PRICES_AS_OF,
        "assumptions": ASSUMPTIONS,
        "durations_billed": {**billed, "aws_latency_ms": AWS_LATENCY_MS},
        "memory_gb": mem,
        "lease_limit": LEASE_LIMIT,
        "quick": short,
        "rerun": "make bench" + (" QUICK=1" if short else "") + "  (or python -m bench.cost)",
    }
    if args.only:  # the other groups' scenarios stay as the last run measured them
        section = merged(last_results("cost"), section)
        per_m = section["usd_per_million_fires"]
    path = write_results("cost", section)
    per_op = section["usd_per_million_ops"]
    print("cost per million fires: " + ", ".join(f"{k} ${v:.3f}" for k, v in per_m.items())
          + "; per million operations: " + ", ".join(f"{k} ${v:.3f}" for k, v in per_op.items())
          + f"; idle ${section['usd_per_idle_month']:.2f}/month"
          + f"\nwritten to {path}; rerun: {section['rerun']}")  # fmt: skip
    checks = section["checks"]
    return 0 if checks["every_fire_delivered"] and not checks["early"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
