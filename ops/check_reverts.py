"""Each defect the fire path has had (tests/stateful/reverts/), put back, must make the
stateful test fail.

``python -m ops.check_reverts [--examples N] [PATCH ...]`` (``make reverts``): for each patch in
``tests/stateful/reverts/`` (or those named), export the committed code (``git archive HEAD``)
to a temporary directory, apply the patch there, run the stateful test on that copy (its own
code first on the import path; Hypothesis does not shrink, so a failure ends the run at once)
and report whether the test caught the defect - with the assertion that failed - or missed
it. Exits non-zero if any defect went unnoticed. The checkout itself is never touched.

Each patch gets the fixed-seed run ``make test`` makes, then, if that passes, the soak's
random search under each of SEEDS (deterministic: a seed replays): a change anywhere on the
fire path (how many Redis commands an operation makes, which DynamoDB call a fault meets)
moves the fixed seed's trajectories, so one seed alone says little about the test's power.
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
SEEDS = (None, 1, 2, 3)  # None: the fixed-seed (derandomized) run; then seeded soaks


FAILURE = r"^(?:E|\s*\|)\s+((?:\w+\.)*\w*(?:Error|Exception|Runaway|Kill)\b.*)$"
"""A failure pytest prints: an assertion, or the world's Runaway (a loop that never ends), a
name qualified or not; on an ``E`` line, or as a member of an exception group (``|``: a
failure in the machine's teardown settle)."""


def first_failure(output: str) -> str | None:
    """The failure on an ``E`` line if there is one, else an exception group's first."""
    matches = list(re.finditer(FAILURE, output, re.M))
    direct = [m for m in matches if m.group(0).startswith("E")]
    return (direct or matches)[0].group(1) if matches else None


def export_head(into: Path) -> None:
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def check(patch: Path, examples: int) -> tuple[bool, str, float]:
    """(caught, what failed or why not, seconds) over SEEDS, up to the first catch."""
    spent, what = 0.0, ""
    for seed in SEEDS:
        caught, what, seconds = check_seed(patch, examples, seed)
        spent += seconds
        how = "fixed seed" if seed is None else f"seed {seed}"
        if caught:
            return True, f"[{how}] {what}", spent
    return False, what, spent


def check_seed(patch: Path, examples: int, seed: int | None) -> tuple[bool, str, float]:
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
        env.pop("TIMERS_MACHINE_RANDOM", None)
        command = [sys.executable, "-m", "pytest", TEST, "-x", "-q", "-p", "no:cacheprovider"]
        if seed is not None:
            env["TIMERS_MACHINE_RANDOM"] = "1"
            command.append(f"--hypothesis-seed={seed}")
        started = time.monotonic()
        try:
            run = subprocess.run(
                command,
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
        how = "the fixed seed" if seed is None else f"seed {seed}"
        return False, f"the stateful test passed {examples} examples of {how}", elapsed
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / f"{patch.stem}.log").write_text(run.stdout + run.stderr)
    found = first_failure(run.stdout)
    harness = re.search(r"^E\s+(hypothesis\.errors\.\w+.*)$", run.stdout, re.M)
    if found is None and harness is not None:  # the test's own machinery failed: no verdict
        return False, f"no verdict: {harness.group(1)[:160]}", elapsed
    return True, (found[:200] if found else f"see {LOGS}/{patch.stem}.log"), elapsed


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
