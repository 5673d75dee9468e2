"""Cold-start imports: the CPU each function's handler module takes to import (``imports``).

``python -m bench.imports`` (``QUICK=1``: 3 runs per function instead of 5; ``--function api``
for one) imports each function's handler in a fresh interpreter, as a Lambda sandbox's INIT
does: the function's environment as ``make run`` gives it (template.yaml's variables, the local
endpoints, no X-Ray daemon), its code paths first on ``sys.path``, and nothing imported before
but what the interpreter itself loads. It measures ``time.process_time()`` around
``import_module`` (the CPU of the import only, not the interpreter's start) and the wall time,
and lists the heavy modules the import left loaded (``HEAVY``: each should load on the first
request that needs it, not at import). Targets (issue 37): api <= 0.6 s, trigger <= 0.4 s.

Three ways: **compiled** (every bytecode cache warm, as on ``make run`` after its first
start), **as deployed** (the project's own code - the function's directory and the shared
layer's ``timers`` - copied without its ``.pyc`` and run with ``PYTHONDONTWRITEBYTECODE``, as
on Lambda, whose read-only file system keeps no bytecode of the code ``sam build`` copies as
source; the installed packages keep theirs) and **from source** (an empty bytecode cache for
everything, stdlib and packages too, ``PYTHONPYCACHEPREFIX``: the worst case, a fresh
interpreter's first import of all of it). Results merge into ``bench/results/latest.json``
under ``imports``: per way and function, the median and the range of the runs.

The other benchmarks run each function in the local stack, so this one needs no stack: it reads
the template only. The CPU of a run depends on what else runs on the machine (and on the
page cache: the first run after an install reads files); run it twice and compare.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import progress, quick, write_results

RUNS, QUICK_RUNS = 5, 3
TARGETS_S = {"ApiFunction": 0.6, "TriggerFunction": 0.4}
HEAVY = (
    "aws_xray_sdk",
    "redis.asyncio",
    "pynamodb",
    "boto3",
    "pydantic",
    "aws_lambda_powertools.event_handler.openapi.models",
    "aws_lambda_powertools.event_handler.appsync",
    "aws_lambda_powertools.event_handler.openapi.swagger_ui",
    "cronsim",
)
"""Modules that cost tens to hundreds of ms each: whether the handler's import loaded them."""

_CHILD = r"""
import json, os, sys, time
from importlib import import_module
spec = json.loads(sys.argv[1])
os.environ.clear()
os.environ.update(spec["env"])
time.tzset()
sys.path[:0] = spec["paths"]
wall, cpu = time.perf_counter(), time.process_time()
import_module(spec["module"])
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
heavy = [m for m in spec["heavy"]  # imported, its __init__ run (timers.deferred_imports)
         if m in sys.modules and "__deferred_init__" not in vars(sys.modules[m])]
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "heavy": heavy, "modules": len(sys.modules)}))
"""


def function_specs() -> dict[str, dict[str, Any]]:
    """Each function's module, code paths and environment, as the local stack runs them."""
    from ops.local.lambdas import sandbox_env
    from ops.local.spec import load_stack

    local = {"REDIS_URL": "redis://127.0.0.1:6390/0", "REDIS_CLUSTER": "false"}
    stack = load_stack(local)
    runtime = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:4566",
        "AWS_ENDPOINT_URL_LAMBDA": "http://127.0.0.1:3000",
        "AWS_SAM_LOCAL": "true",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
    }
    return {
        name: {
            "module": f.module,
            "paths": list(f.code_paths),
            "env": sandbox_env(f, stack.region, runtime),
            "heavy": list(HEAVY),
        }
        for name, f in stack.functions.items()
    }


WAYS = ("compiled", "as_deployed", "from_source")


def import_once(spec: dict[str, Any], way: str = "compiled") -> dict[str, Any]:
    """Import one handler module in a fresh interpreter: its CPU, wall time, heavy modules,
    one of the WAYS."""
    with tempfile.TemporaryDirectory(prefix="bench-imports-") as scratch:
        env, paths = spec["env"], spec["paths"]
        if way == "from_source":
            env = {**env, "PYTHONPYCACHEPREFIX": scratch}
        elif way == "as_deployed":
            env = {**env, "PYTHONDONTWRITEBYTECODE": "1"}
            paths = [_copy_source(path, Path(scratch) / str(n)) for n, path in enumerate(paths)]
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps({**spec, "paths": paths})],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    if done.returncode != 0:
        raise RuntimeError(f"importing {spec['module']} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _copy_source(path: str, to: Path) -> str:
    """A code path's sources, without bytecode (the project's code as sam build packages it)."""
    shutil.copytree(path, to, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return str(to)


def measure(spec: dict[str, Any], runs: int, way: str = "compiled") -> dict[str, Any]:
    import_once(spec)  # the page cache and the bytecode cache: the first run fills them
    samples = [import_once(spec, way) for _ in range(runs)]
    cpu = sorted(s["cpu_s"] for s in samples)
    wall = sorted(s["wall_s"] for s in samples)
    return {
        "runs": runs,
        "cpu_s": {"median": round(statistics.median(cpu), 3), "min": round(cpu[0], 3),
                  "max": round(cpu[-1], 3)},
        "wall_s": {"median": round(statistics.median(wall), 3), "min": round(wall[0], 3),
                   "max": round(wall[-1], 3)},
        "modules": samples[-1]["modules"],
        "heavy_loaded": samples[-1]["heavy"],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.imports", description=__doc__)
    parser.add_argument("--function", action="append", help="e.g. api or TriggerFunction")
    parser.add_argument("--runs", type=int, default=QUICK_RUNS if quick() else RUNS)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    specs = function_specs()
    wanted = {w.lower().removesuffix("function") for w in args.function or []}
    out: dict[str, Any] = {"targets_cpu_s": TARGETS_S, **{way: {} for way in WAYS}}
    for name, spec in specs.items():
        if wanted and name.lower().removesuffix("function") not in wanted:
            continue
        progress(f"imports: {name} ({spec['module']}), {args.runs} fresh interpreters each way")
        for way in WAYS:
            m = measure(spec, args.runs, way)
            out[way][name] = m
            target = TARGETS_S.get(name)
            verdict = "" if target is None else f" (target <= {target} s)"
            print(
                f"{name:<18} {way:<11} import CPU median "
                f"{m['cpu_s']['median']:.3f} s [{m['cpu_s']['min']:.3f}-{m['cpu_s']['max']:.3f}]"
                f"{verdict}, wall {m['wall_s']['median']:.3f} s, {m['modules']} modules; heavy "
                f"loaded: {', '.join(m['heavy_loaded']) or 'none'}"
            )
    if not args.no_write and not wanted:
        print(f"wrote {write_results('imports', out)} (section imports)")
    print("rerun: .venv/bin/python -m bench.imports [--function api] [--runs N]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
