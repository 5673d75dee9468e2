"""Each of issue 16's defects, put back, must make the stateful test fail.

``python -m ops.check_reverts [--examples N] [PATCH ...]`` (``make reverts``): for each patch in
``tests/stateful/reverts/`` (or those named), export the committed code (``git archive HEAD``)
to a temporary directory, apply the patch there, run the stateful test on that copy (its own
code first on the import path; Hypothesis does not shrink, so a failure ends the run at once)
and report whether the test caught the defect - with the assertion that failed - or missed
it. Exits non-zero if any defect went unnoticed. The checkout itself is never touched.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REVERTS = ROOT / "tests" / "stateful" / "reverts"
TEST = "tests/stateful/test_fire_path_machine.py"
LOGS = ROOT / "bench" / "results" / "logs" / "reverts"  # each caught run's output (ignored)


TIMEOUT_S = 20 * 60  # a run that neither fails nor passes by then missed the defect too


def export_head(into: Path) -> None:
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def check(patch: Path, examples: int) -> tuple[bool, str, float]:
    """(caught, what failed or why not, seconds)."""
    with tempfile.TemporaryDirectory(prefix="revert-") as tmp:
        copy = Path(tmp)
        export_head(copy)
        subprocess.run(["git", "apply", str(patch)], cwd=copy, check=True)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(str(copy / p) for p in ("layers/shared", "clients", ".")),
            "TIMERS_MACHINE_EXAMPLES": str(examples),
            "TIMERS_MACHINE_SHRINK": "0",
        }
        started = time.monotonic()
        try:
            run = subprocess.run(
                [sys.executable, "-m", "pytest", TEST, "-x", "-q", "-p", "no:cacheprovider"],
                cwd=copy,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return False, f"no verdict in {TIMEOUT_S} s", time.monotonic() - started
        elapsed = time.monotonic() - started
    if run.returncode == 0:
        return False, f"the stateful test passed {examples} examples", elapsed
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / f"{patch.stem}.log").write_text(run.stdout + run.stderr)
    found = re.search(r"^E\s+(\w+(?:Error|Exception|Runaway|Kill)\b.*)$", run.stdout, re.M)
    harness = re.search(r"^E\s+(hypothesis\.errors\.\w+.*)$", run.stdout, re.M)
    if found is None and harness is not None:  # the test's own machinery failed: no verdict
        return False, f"no verdict: {harness.group(1)[:160]}", elapsed
    return True, (found.group(1)[:200] if found else f"see {LOGS}/{patch.stem}.log"), elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.check_reverts", description=__doc__)
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("patches", nargs="*", type=Path)
    args = parser.parse_args(argv)
    patches = args.patches or sorted(REVERTS.glob("*.patch"))
    missed = 0
    for patch in patches:
        caught, what, seconds = check(patch.resolve(), args.examples)
        missed += not caught
        verdict = "caught" if caught else "MISSED"
        print(f"{verdict:6}  {patch.stem}  ({seconds:.0f} s): {what}", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
