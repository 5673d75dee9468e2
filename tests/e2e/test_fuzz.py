"""Fuzzing: schemathesis against the running local stack, driven by its own OpenAPI document,
as a user would run it (``st run http://127.0.0.1:3000/v1/openapi.json``).

Every operation gets the document's examples, schemathesis' coverage cases (boundaries and
each way to break each constraint) and generated cases, valid and invalid ("negative"). Each
answer must pass the five checks below: no 5xx, only declared status codes, the declared
content type, a body valid against the declared schema, and every invalid request rejected
with a 4xx. Nothing is excluded or relaxed; a failure here is a bug in the API or the document.

Bounded and repeatable: a fixed number of generated cases per operation, generated
deterministically (which also means no example database) with a fixed seed. The timers it
creates are deleted as soon as they are created (``tests/support/fuzz_hooks.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ops.template import ROOT
from tests.support.local_stack import RunningStack, admin

pytestmark = pytest.mark.e2e

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
]
CASES_PER_OPERATION = 20  # generated; the examples and coverage cases come on top
SEED = 20261123
RUN_TIMEOUT_S = 170  # a hung run fails the test rather than the suite


def test_no_answer_of_the_api_breaks_its_own_contract(local_stack: RunningStack) -> None:
    key = admin(local_stack, "tenant", "create", "fuzz")["api_key"]
    st = Path(sys.executable).parent / "st"
    command = [
        str(st), "run", f"{local_stack.api}/openapi.json",
        "--checks", ",".join(CHECKS),
        "--phases", "examples,coverage,fuzzing",
        "--mode", "all",  # valid and invalid requests
        "--max-examples", str(CASES_PER_OPERATION),
        "--generation-deterministic", "--seed", str(SEED),
        "--workers", "1",
        "--header", f"x-api-key: {key}",
        "--request-timeout", "30",
        "--no-color",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SCHEMATHESIS_HOOKS": "tests.support.fuzz_hooks",
        "FUZZ_API": local_stack.api,
        "FUZZ_API_KEY": key,
    }
    run = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    # Every operation of the document was fuzzed - but the document's own (GET
    # /v1/openapi.json), which schemathesis leaves out when it loads the document by its URL.
    _, document, _ = local_stack.request("GET", "/openapi.json")
    operations = sum(len(item) for item in document["paths"].values()) - 1
    assert f"{operations} selected / {operations} total" in report
    counts = re.search(r"(\d+) generated, (\d+) passed", report)
    assert counts, report
    generated, passed = map(int, counts.groups())
    assert generated == passed > 0, report
    status, left, _ = local_stack.request("GET", "/timers", key=key)
    assert (status, left["items"]) == (200, [])  # the hook deleted every timer it created
