"""Whole numbers in text, read in ASCII digits only.

``int()``, ``str.isdigit`` and a regex's ``\\d`` take the decimal digits of every script - the
full-width ones (U+FF10-FF19), the Arabic-Indic ones (U+0660-0669), and dozens more - and
``isdigit`` even a superscript two (U+00B2), which ``int()`` then refuses with a ValueError (a
500 where a 400 was due). ``int()`` also takes ``_`` between digits and space around them. What
the service reads from outside - a query parameter, a path segment, a cursor, an answer's
header, the environment - is 0-9 or nothing.
"""

from __future__ import annotations


def is_ascii_digits(text: str) -> bool:
    """``text`` is one or more of 0-9, and nothing else."""
    return text.isascii() and text.isdigit()


def ascii_int(text: str) -> int | None:
    """The whole number ``text`` spells in 0-9 (no sign, space or ``_``); None otherwise."""
    return int(text) if is_ascii_digits(text) else None
