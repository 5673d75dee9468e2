"""The defects ``make reverts`` puts back must still apply to the code as it is: a patch that
no longer applies would leave that defect unchecked (ops/check_reverts.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ops.check_reverts import REVERTS, ROOT


@pytest.mark.parametrize("patch", sorted(REVERTS.glob("*.patch")), ids=lambda p: p.stem)
def test_each_defect_still_applies_to_the_code(patch: Path) -> None:
    check = subprocess.run(
        ["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_there_is_a_patch_for_each_of_the_five_defects() -> None:
    assert [p.name.split("-")[0] for p in sorted(REVERTS.glob("*.patch"))] == list("12345")
