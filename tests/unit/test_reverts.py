"""The defects ``make reverts`` puts back must still apply to the code as it is: a patch that
no longer applies would leave that defect unchecked (ops/check_reverts.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ops.check_reverts import REVERTS, ROOT, first_failure


@pytest.mark.parametrize("patch", sorted(REVERTS.glob("*.patch")), ids=lambda p: p.stem)
def test_each_defect_still_applies_to_the_code(patch: Path) -> None:
    check = subprocess.run(
        ["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_there_is_a_patch_for_each_of_the_seven_defects() -> None:
    assert [p.name.split("-")[0] for p in sorted(REVERTS.glob("*.patch"))] == list("1234567")


@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("E       AssertionError: sent twice", "AssertionError: sent twice"),
        (
            "E   tests.stateful.world.Runaway: 30001 calls",
            "tests.stateful.world.Runaway: 30001 calls",
        ),
        ("E   Runaway: a run of bucket 3 never ends", "Runaway: a run of bucket 3 never ends"),
        ("E       assert 1 == 2", None),
    ],
)
def test_a_failure_is_read_off_pytests_output_qualified_or_not(
    line: str, found: str | None
) -> None:
    """A defect that makes a loop run for ever fails as the world's Runaway, which pytest
    prints with its module: it counts as caught, with its message."""
    assert first_failure(f"log\n{line}\nmore log\n") == found


def test_an_e_line_comes_before_an_exception_groups_members() -> None:
    """A failure in the teardown's settle is printed as a member of an exception group; an
    ``E`` line, where there is one, is the test's own failure."""
    group = "  +-+---- 1 ----\n    | AssertionError: lost fires of tmr_1\n"
    assert first_failure(group) == "AssertionError: lost fires of tmr_1"
    assert first_failure(group + "E   AssertionError: sent twice\n") == "AssertionError: sent twice"
