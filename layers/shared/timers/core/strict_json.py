"""JSON the service stores and sends on: what RFC 8259 allows, in a shape every consumer reads.

Python's ``json`` module is lenient where a callback's consumer is not: it accepts ``NaN`` and
``Infinity`` (not JSON), strings holding a lone UTF-16 surrogate (``"\\ud800"``, which has no
UTF-8 form), and nesting as deep as its recursion limit. The api parses request bodies with
:func:`loads`, so such input is a 400 naming the field, never a 500 or a callback nobody can
parse.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from timers.core.errors import FieldError, InvalidInput

MAX_DEPTH = 32
"""Arrays and objects nested at most this deep - DynamoDB's own limit for a document."""

_SURROGATE = re.compile("[\ud800-\udfff]")


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not JSON; send a number or a string")


def loads(text: str) -> Any:
    """``text`` parsed, or InvalidInput naming the field and why it is unfit. Text that is not
    JSON at all raises json's own JSONDecodeError, which the request's parser reports the same
    way for every route."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except _NotJson as exc:
        raise _invalid(FieldError("body", str(exc))) from None
    except RecursionError:
        raise _invalid(FieldError("body", f"nested more than {MAX_DEPTH} levels deep")) from None
    if unfit := _walk(value):
        raise _invalid(unfit)
    return value


def _invalid(unfit: FieldError) -> InvalidInput:
    return InvalidInput("the request is invalid", [unfit])


def _walk(root: Any) -> FieldError | None:
    """The first value too deep or holding a lone surrogate, depth first; no recursion."""
    stack: list[tuple[str, Any, int]] = [("", root, 0)]
    while stack:
        path, value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                return FieldError(path or "body", f"nested more than {MAX_DEPTH} levels deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and _SURROGATE.search(key):
                    return FieldError(path or "body", _lone_surrogate("a key"))
                stack.append((_join(path, key), item, depth + 1))
        elif isinstance(value, str) and _SURROGATE.search(value):
            return FieldError(path or "body", _lone_surrogate("the string"))
        elif isinstance(value, float) and not math.isfinite(value):  # 1e400 parses as inf
            return FieldError(path or "body", "a number beyond the range of a double")
    return None


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _lone_surrogate(what: str) -> str:
    return f"{what} holds a lone UTF-16 surrogate, which has no UTF-8 form"
