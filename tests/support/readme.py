"""The README's code examples, as a test runs them."""

from __future__ import annotations

import re

from ops.template import ROOT

README = ROOT / "README.md"


def code_block(after: str, language: str) -> str:
    """The first fenced ``language`` block after the first line that contains ``after``."""
    text = README.read_text(encoding="utf-8")
    start = text.index(after)
    found = re.compile(rf"^```{language}\n(.*?)^```$", re.S | re.M).search(text, start)
    assert found is not None, f"no {language} block after {after!r} in the README"
    return found.group(1)


def substituted(code: str, replacements: dict[str, str]) -> str:
    """``code`` with each key replaced (in order); each must be there."""
    for old, new in replacements.items():
        assert old in code, f"the README's example no longer has {old!r}"
        code = code.replace(old, new)
    return code
