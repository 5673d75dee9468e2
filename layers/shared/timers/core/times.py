"""Epoch-millisecond time helpers. Internally every instant is an ``int`` of epoch ms (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime

_RFC3339_HINT = "an RFC 3339 date-time with an offset, e.g. 2026-11-21T10:00:00Z"


def to_ms(dt: datetime) -> int:
    """Epoch milliseconds of an aware datetime (sub-millisecond parts are truncated)."""
    if dt.tzinfo is None:
        raise ValueError("naive datetime")
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


def from_ms(ms: int) -> datetime:
    """Aware UTC datetime of epoch milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(microsecond=(ms % 1000) * 1000)


def format_ms(ms: int) -> str:
    """The contract's output format: UTC, millisecond precision, e.g. 2026-11-21T10:00:00.000Z.

    The year always has four digits (``0605-08-21T...``; strftime's ``%Y`` gives ``605``)."""
    return from_ms(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 date-time that carries an offset (``Z`` or ``±hh:mm``).

    Raises ValueError for anything else, including naive date-times, which RFC 3339 forbids.
    """
    if not isinstance(text, str) or "T" not in text.upper():
        raise ValueError(f"expected {_RFC3339_HINT}")
    try:
        dt = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise ValueError(f"expected {_RFC3339_HINT}") from None
    if dt.tzinfo is None:
        raise ValueError(f"missing offset: expected {_RFC3339_HINT}")
    try:
        # 0001-01-01T00:00:00+01:00 is in the year 0, 9999-12-31T23:00:00-01:00 in 10000
        dt.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range: the instant must fall in the years 1 to 9999 UTC") from None
    return dt


def parse_ms(text: str) -> int:
    return to_ms(parse_rfc3339(text))
