"""Shared helpers of the benchmarks: the machine, progress lines, and the results file."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULTS = RESULTS_DIR / "latest.json"

_STARTED = time.monotonic()


def quick() -> bool:
    """``QUICK=1`` in the environment: the short variant (``make bench QUICK=1``)."""
    return os.environ.get("QUICK", "").strip().lower() in {"1", "true", "yes", "on"}


def progress(msg: str) -> None:
    """One progress line on stderr, stamped with the seconds since the benchmark started."""
    print(f"[{time.monotonic() - _STARTED:7.1f}s] {msg}", file=sys.stderr, flush=True)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def _redis_version() -> str | None:
    from ops.redis_server import find_redis_server

    try:
        out = subprocess.run(
            [find_redis_server(), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # "Redis server v=6.2.14 sha=... malloc=libc ..."
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return out.strip() or None


def machine() -> dict[str, Any]:
    """What the numbers were measured on: a rate means little without it."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "redis_server": _redis_version(),
    }


def last_results(section: str) -> dict[str, Any]:
    """A section of the results file as it stands (empty if none): for a benchmark that writes
    one part of a section another benchmark also writes (e2e and e2e.cold, engine and
    engine.hot_second)."""
    try:
        return dict(json.loads(RESULTS.read_text()).get(section, {}))
    except (OSError, ValueError):
        return {}


def write_results(section: str, data: dict[str, Any]) -> Path:
    """Merge one top-level section (and ``machine``) into the results file.

    Read-modify-write keeps the other benchmark's section; the temp file + rename means a
    reader never sees a half-written file (``bench/results/*.tmp`` is gitignored).
    """
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    try:
        current: dict[str, Any] = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        current = {}
    current[section] = data
    current["machine"] = machine()
    fd, tmp = tempfile.mkstemp(dir=RESULTS_DIR, prefix="latest.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(current, f, indent=2, sort_keys=False)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the results are for everyone
        os.replace(tmp, RESULTS)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return RESULTS
