"""The code examples of the README (or of a page under docs/), as a test runs them."""

from __future__ import annotations

import re
from pathlib import Path

from ops.template import ROOT

README = ROOT / "README.md"


def code_block(after: str, language: str, page: Path = README) -> str:
    """The first fenced ``language`` block of ``page`` after the first line that contains
    ``after``."""
    text = page.read_text(encoding="utf-8")
    start = text.index(after)
    found = re.compile(rf"^```{language}\n(.*?)^```$", re.S | re.M).search(text, start)
    assert found is not None, f"no {language} block after {after!r} in {page.name}"
    return found.group(1)


def substituted(code: str, replacements: dict[str, str]) -> str:
    """``code`` with each key replaced (in order); each must be there."""
    for old, new in replacements.items():
        assert old in code, f"the example no longer has {old!r}"
        code = code.replace(old, new)
    return code
