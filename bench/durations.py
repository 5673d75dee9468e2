"""Measured Lambda durations: what each function's invocations took on the local stack, read
from the REPORT line the local runtime writes per invocation (as Lambda does), beside what the
cost model states.

``python -m bench.durations [LABEL ...]`` reads the stack logs ``bench.e2e`` keeps of its last
run (``bench/results/logs/<label>/<Function>.log``; default: every label there). For each
function: invocations, wall duration and the sandbox process's own CPU (p50, mean), INIT; for
the trigger also per fire (its one "trigger run" line per invocation says how many it
enqueued) and apart for the runs that enqueued nothing.

Wall time here is not AWS's: moto answers DynamoDB and SQS calls slower than AWS, and two cores
are shared by every process. CPU is the function's own work. An estimate of the billed
duration on AWS is therefore CPU + the trigger's armed wait + its calls at AWS's latency,
which is what ``bench.cost`` bills: the CPU measured here (``all``: every label's invocations
together; the trigger's as a fit per run and per fire) plus each call the cost stack counts at
AWS's stated latency.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import progress, write_results
from bench.e2e import LOGS

REPORT = re.compile(
    r"REPORT RequestId: (?P<id>\S+)\tDuration: (?P<ms>[\d.]+) ms\t.*?CPU: (?P<cpu>[\d.]+) ms"
    r"(?:\tInit Duration: (?P<init>[\d.]+) ms)?"
)
FUNCTIONS = ("ApiFunction", "TriggerFunction", "FanoutFunction", "MigratorFunction",
             "DeliveryFunction")  # fmt: skip
STATED_MS = {  # bench.cost's ASSUMPTIONS, per invocation (the trigger: a run that sends)
    "ApiFunction": 40,
    "TriggerFunction": 190,  # 150 ms armed wait + 40 ms
    "MigratorFunction": 1_000,
    "DeliveryFunction": 190,
}


def reports(log: Path) -> list[dict[str, Any]]:
    """Each invocation's REPORT, with the trigger's run line (its counters) merged in."""
    runs: dict[str, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        if '"trigger run"' in line:
            run = json.loads(line)
            runs[run.get("function_request_id", "")] = run
        elif (m := REPORT.search(line)) is not None:
            out.append({"id": m["id"], "ms": float(m["ms"]), "cpu_ms": float(m["cpu"]),
                        "init_ms": float(m["init"]) if m["init"] else None})  # fmt: skip
    for r in out:
        r["enqueued"] = runs.get(r["id"], {}).get("enqueued", 0)
    return out


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "mean": None}
    return {"p50": round(statistics.median(values), 1), "mean": round(statistics.fmean(values), 1)}


def function_summary(name: str, invocations: list[dict[str, Any]]) -> dict[str, Any]:
    inits = [r["init_ms"] for r in invocations if r["init_ms"] is not None]
    out: dict[str, Any] = {
        "invocations": len(invocations),
        "duration_ms": stats([r["ms"] for r in invocations]),
        "cpu_ms": stats([r["cpu_ms"] for r in invocations]),
        "cold_starts": len(inits),
        "init_ms": stats(inits),
        "stated_ms": STATED_MS.get(name),
    }
    if name == "TriggerFunction":
        sending = [r for r in invocations if r["enqueued"]]
        fires = sum(r["enqueued"] for r in sending)
        out["fires"] = fires
        out["runs_that_sent"] = len(sending)
        out["sending_run_duration_ms"] = stats([r["ms"] for r in sending])
        out["sending_run_cpu_ms"] = stats([r["cpu_ms"] for r in sending])
        out["empty_run_duration_ms"] = stats([r["ms"] for r in invocations if not r["enqueued"]])
        if fires:
            out["duration_ms_per_fire"] = round(sum(r["ms"] for r in invocations) / fires, 1)
            out["cpu_ms_per_fire"] = round(sum(r["cpu_ms"] for r in invocations) / fires, 2)
        out["cpu_ms_fit"] = cpu_fit([r for r in sending if r["init_ms"] is None])
    return out


def cpu_fit(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """A warm sending run's CPU as ``per_run + per_fire * fires`` (least squares): what the
    cost model bills a run and each of its fires, cold starts left out (INIT is billed apart)."""
    if len({r["enqueued"] for r in runs}) < 2:
        return None
    xs, ys = [float(r["enqueued"]) for r in runs], [r["cpu_ms"] for r in runs]
    slope, intercept = statistics.linear_regression(xs, ys)
    return {"per_run": round(max(0.0, intercept), 1), "per_fire": round(max(0.0, slope), 3),
            "runs": len(runs)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    labels = (sys.argv[1:] if argv is None else argv) or sorted(
        p.name for p in LOGS.iterdir() if p.is_dir()
    )
    section: dict[str, Any] = {}
    pooled: dict[str, list[dict[str, Any]]] = {f: [] for f in FUNCTIONS}
    for label in labels:
        folder = LOGS / label
        logs = {f: folder / f"{f}.log" for f in FUNCTIONS}
        found = {f: reports(log) for f, log in logs.items() if log.exists()}
        section[label] = {f: function_summary(f, rs) for f, rs in found.items() if rs}
        for f, rs in found.items():
            pooled[f] += rs
    section["all"] = {f: function_summary(f, rs) for f, rs in pooled.items() if rs}
    for label, functions in section.items():
        for name, summary in functions.items():
            progress(f"durations {label} {name}: {json.dumps(summary)}")
    section["rerun"] = "python -m bench.e2e fresh && python -m bench.durations"
    path = write_results("durations", section)
    print(f"written to {path}; rerun: {section['rerun']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
