"""HTTP targets: the pure rules - what a target may be, which addresses are refused, and how
long a fire to it is retried (a timer's retry policy). No I/O here (see
timers.delivery.http_target for the POST, timers.delivery for the delivery function; one
POST's signature and answer are timers.core.webhook_attempts).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from timers.core.errors import FieldError

URL_MAX_CHARS = 2_048
HEADERS_MAX = 10
HEADER_NAME_MAX = 64
HEADER_VALUE_MAX = 1_024
RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
"""Besides every ``webhook-*`` header: what the service sets itself, or what would change how
the request is framed. (A ``content-type`` is accepted and replaced: the body is JSON.)"""

RETRY_FOR_MS = 24 * 3_600_000
"""A fire is retried until its first attempt is this old (the contract: at least 24 h)."""
RETRY_ATTEMPTS_RANGE = (1, 100)
RETRY_AGE_RANGE_S = (60, 86_400)
"""A timer's ``retry`` policy: ``max_attempts`` POSTs, ``max_age_seconds`` after the due time."""

# Used with fullmatch: ``$`` would also match before a final newline.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 header field name
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")  # no CR, LF or other controls; Latin-1
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)


MASKED = "********"
"""What the API shows of a header value. The names tell targets apart; the values (a token,
typically) are the user's secrets: given once, used for delivery, never shown again."""
STORED_HEADERS = "stored_headers"
"""A PATCH's change of the target that keeps header values the timer has: True when the
request gave no headers at all (every one is kept), False when it gave them (only those whose
value is MASKED are kept). See :func:`keeping_stored_values`."""


@dataclass(frozen=True)
class Webhook:
    """An HTTP target: POST to ``url`` with the user's extra ``headers``."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, object]:
        """With the header values: for delivery only (the delivery message, the card)."""
        return {"url": self.url, "headers": dict(self.headers)}

    def shown(self) -> dict[str, object]:
        """As the API shows it: the header names, their values masked."""
        return {"url": self.url, "headers": {name: MASKED for name, _ in self.headers}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Webhook:
        body = json.loads(text)
        return cls(body["url"], tuple((str(k), str(v)) for k, v in body.get("headers", {}).items()))

    @property
    def origin(self) -> str:
        """scheme://host:port - the unit of the per-target concurrency cap."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def masked_headers(headers: Mapping[str, str] | None) -> list[FieldError]:
    """A new target cannot keep values it never had: a MASKED value (what GET shows) is
    refused where no stored value stands behind it."""
    return [
        FieldError(f"target.headers.{name}", "is masked (as the API shows it); give its value")
        for name, value in (headers or {}).items()
        if value == MASKED
    ]


def keeping_stored_values(
    given: Webhook, stored: Webhook | None, headers_omitted: bool
) -> tuple[Webhook | None, list[FieldError]]:
    """A PATCH's webhook with the stored header values it keeps: all of them when it gave no
    headers, else those it gave as MASKED. Kept only for the same origin: a header value (a
    token) is never carried to another host unless the request gives it again."""
    kept = dict(stored.headers) if stored is not None else {}
    if headers_omitted and not kept:
        return given, []
    keeps_any = headers_omitted or any(value == MASKED for _, value in given.headers)
    if kept and keeps_any and stored is not None and stored.origin != given.origin:
        reason = "give the header values again when the URL moves to another origin"
        return None, [FieldError("target.headers", reason)]
    if headers_omitted:
        return Webhook(given.url, tuple(kept.items())), []
    by_name = {name.lower(): value for name, value in kept.items()}
    pairs: list[tuple[str, str]] = []
    for name, value in given.headers:
        if value == MASKED:
            if name.lower() not in by_name:
                return None, masked_headers({name: value})
            value = by_name[name.lower()]
        pairs.append((name, value))
    return Webhook(given.url, tuple(pairs)), []


def is_loopback_host(host: str) -> bool:
    """127.0.0.1, ::1 or localhost: what address_allowed admits when loopback is allowed."""
    try:
        return ipaddress.ip_address(host) in LOOPBACK_TARGETS
    except ValueError:
        return host.lower() == "localhost"


LOOPBACK_REFUSED = (
    "is a loopback address: loopback targets are refused; on the local stack, start it with "
    "TIMERS_ALLOW_LOOPBACK_TARGETS=1 to allow them (plain http too)"
)
"""What the local stack says of a loopback target it refuses: the setting that allows it."""


def validate_target(
    url: object, headers: object, allow_loopback: bool = False, local_stack: bool = False
) -> tuple[Webhook | None, list[FieldError]]:
    """The webhook, or what is wrong with it (fields ``target.url``, ``target.headers``).

    HTTPS only, no credentials, at most URL_MAX_CHARS; ``http://`` is accepted only for a
    loopback host when the deployment allows loopback targets (the local stack, for tests).
    On the local stack (``local_stack``) without that setting, a loopback target refused here
    (plain http to a loopback host, or a loopback literal) is one error that names the setting;
    what is accepted is the same everywhere (``https://localhost`` is judged at delivery).
    Whatever http.client would refuse to send (a non-ASCII path, a control character, a line
    break in a header) is refused here, so it never becomes a fire that cannot be sent. An IP
    literal is judged here as at delivery (address_allowed); a name is judged at delivery,
    where it is resolved.
    """
    errors: list[FieldError] = []
    if not isinstance(url, str) or not url:
        return None, [FieldError("target.url", "must be an https:// URL")]
    if len(url) > URL_MAX_CHARS:
        errors.append(FieldError("target.url", f"must be at most {URL_MAX_CHARS} characters"))
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return None, [FieldError("target.url", "is not a valid URL")]
    loopback_hint = (local_stack and not allow_loopback and is_loopback_host(host)
                     and (parts.scheme == "http" or _is_ip_literal(host)))  # fmt: skip
    if parts.scheme not in ("https", "http") or not host:
        errors.append(FieldError("target.url", "must be an https:// URL with a host"))
    elif loopback_hint:
        errors.append(FieldError("target.url", LOOPBACK_REFUSED))
    elif parts.scheme == "http" and not (allow_loopback and is_loopback_host(host)):
        errors.append(FieldError("target.url", "must use https"))
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        errors.append(FieldError("target.url", "must not contain credentials"))
    if any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in url) or parts.fragment:
        errors.append(FieldError("target.url", "must have no whitespace, controls or fragment"))
    elif not (parts.path + parts.query).isascii():  # http.client sends the path as ASCII
        errors.append(FieldError("target.url", "path and query must be ASCII (percent-encode)"))
    if host and not _host_sendable(host):
        errors.append(FieldError("target.url", "host is not a valid host name or IP address"))
    elif _is_ip_literal(host) and not (loopback_hint or address_allowed(host, allow_loopback)):
        errors.append(
            FieldError(
                "target.url",
                "is not a public address (private, loopback, "
                "link-local, metadata or another special-purpose range)",
            )
        )
    pairs: list[tuple[str, str]] = []
    if headers is not None:
        if not isinstance(headers, Mapping):
            errors.append(FieldError("target.headers", "must be an object of strings"))
        else:
            if len(headers) > HEADERS_MAX:
                errors.append(FieldError("target.headers", f"at most {HEADERS_MAX} headers"))
            seen: set[str] = set()
            for name, value in headers.items():
                where = f"target.headers.{name}"
                low = str(name).lower()
                if not isinstance(name, str) or not _TOKEN.fullmatch(name):
                    errors.append(FieldError(where, "is not a valid header name"))
                elif len(name) > HEADER_NAME_MAX:
                    errors.append(FieldError(where, f"name over {HEADER_NAME_MAX} characters"))
                elif low.startswith("webhook-") or low in RESERVED_HEADERS:
                    errors.append(FieldError(where, "is set by the service"))
                elif low in seen:
                    errors.append(FieldError(where, "appears twice"))
                elif not isinstance(value, str) or not _VALUE.fullmatch(value):
                    errors.append(FieldError(where, "must be Latin-1 text without line breaks"))
                elif len(value) > HEADER_VALUE_MAX:
                    errors.append(FieldError(where, f"over {HEADER_VALUE_MAX} characters"))
                else:
                    pairs.append((name, value))
                seen.add(low)
    if errors:
        return None, errors
    return Webhook(url, tuple(pairs)), []


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_sendable(host: str) -> bool:
    """An IP literal, or a name that IDNA-encodes (as the resolver and the Host header will)
    and is not a number: ``2130706433``, ``0x7f.1`` or ``0177.0.0.1`` are IPv4 addresses to
    inet_aton but not to every parser, so only the dotted-quad form of an address is taken."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        host.encode("idna")
    except UnicodeError:
        return False
    last = host.removesuffix(".").rsplit(".", 1)[-1]
    return not _NUMERIC_LABEL.fullmatch(last)


# ---------------------------------------------------------------- addresses


def _networks(*cidrs: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# The IANA special-purpose registries, spelled out: ``is_global`` changes between Python
# versions, and this list is what the guard promises.
DENIED_IPV4 = _networks(
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private
    "100.64.0.0/10",  # shared (CGNAT)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local: the EC2/ECS metadata endpoints
    "172.16.0.0/12",  # private
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation
    "192.88.99.0/24",  # 6to4 relay anycast
    "192.168.0.0/16",  # private
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",  # documentation
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the broadcast 255.255.255.255
)
DENIED_IPV6 = _networks(
    "::/96",  # unspecified, loopback, IPv4-compatible (deprecated; some stacks tunnel them)
    "64:ff9b:1::/48",  # local-use NAT64: where the IPv4 address sits is the site's choice
    "100::/64",  # discard
    "2001::/23",  # IETF protocol assignments, Teredo (2001::/32) among them
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation
    "5f00::/16",  # segment routing SIDs
    "fc00::/7",  # unique local: fd00:ec2::254, the EC2 metadata endpoint, among them
    "fe80::/10",  # link-local
    "fec0::/10",  # site-local (deprecated, still routed by some stacks)
    "ff00::/8",  # multicast
)
GLOBAL_UNICAST_IPV6 = ipaddress.IPv6Network("2000::/3")
"""The only IPv6 space allocated for global unicast: anything else not carrying an IPv4
address is refused too, whatever a future registry entry says."""

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the well-known prefix (RFC 6052)
_6TO4 = ipaddress.IPv6Network("2002::/16")
LOOPBACK_TARGETS = frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address packets to ``ip`` end up at, for the forms that carry one: IPv4-mapped
    and NAT64 (the last 32 bits), 6to4 (bits 16-48). None for any other address."""
    if ip in _MAPPED or ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    if ip in _6TO4:
        return ipaddress.IPv4Address((int(ip) >> 80) & 0xFFFF_FFFF)
    return None


def address_allowed(address: str, allow_loopback: bool = False) -> bool:
    """Only public unicast addresses (DENIED_IPV4, DENIED_IPV6; IPv6 outside 2000::/3). An
    IPv6 address that carries an IPv4 one (mapped, NAT64, 6to4) is judged by that IPv4
    address: a public one is reachable that way (an IPv6-only network's DNS64 answers so),
    a private one would reach inside. ``allow_loopback`` admits 127.0.0.1 and ::1 only."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip in LOOPBACK_TARGETS:
        return allow_loopback
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_ipv4(ip)
        if inner is None:
            listed = ip in GLOBAL_UNICAST_IPV6 and not any(ip in n for n in DENIED_IPV6)
            return listed and _public_to_python(ip)
        ip = inner
    return not any(ip in n for n in DENIED_IPV4) and _public_to_python(ip)


def _public_to_python(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Python's ipaddress's view as well: a range its registry knows is refused even before
    the lists above name it."""
    special = (ip.is_private or ip.is_reserved or ip.is_multicast or ip.is_link_local
               or ip.is_loopback or ip.is_unspecified)  # fmt: skip
    return ip.is_global and not special


# ---------------------------------------------------------------- the retry policy


@dataclass(frozen=True)
class RetryPolicy:
    """A timer's ``retry``: how long an HTTP fire is retried. ``max_attempts`` None: no cap;
    ``max_age_s`` None: the default budget (RETRY_FOR_MS from the first attempt). Either given
    bound counts from the fire's due time (from its redelivery, once redelivered)."""

    max_attempts: int | None = None
    max_age_s: int | None = None

    def to_dict(self) -> dict[str, int | None]:
        """As the API echoes it: the bounds given, null for those left to the default."""
        return {"max_attempts": self.max_attempts, "max_age_seconds": self.max_age_s}

    @classmethod
    def from_dict(cls, body: Mapping[str, Any] | None) -> RetryPolicy | None:
        if body is None:
            return None
        return cls(body.get("max_attempts"), body.get("max_age_seconds"))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> RetryPolicy | None:
        return cls.from_dict(json.loads(text)) if text else None

    def errors(self, prefix: str = "retry") -> list[FieldError]:
        out = []
        low, high = RETRY_ATTEMPTS_RANGE
        if self.max_attempts is not None and not low <= self.max_attempts <= high:
            out.append(FieldError(f"{prefix}.max_attempts", f"must be {low} to {high}"))
        low, high = RETRY_AGE_RANGE_S
        if self.max_age_s is not None and not low <= self.max_age_s <= high:
            out.append(FieldError(f"{prefix}.max_age_seconds", f"must be {low} to {high}"))
        return out

    def spent(
        self,
        attempts: int,
        budget_from_ms: int,
        first_ms: int | None,
        now_ms: int,
        default_for_ms: int = RETRY_FOR_MS,
    ) -> str | None:
        """Why no further POST is made (``max_attempts``, ``max_age``), or None: ``attempts``
        made in this budget, which started at ``budget_from_ms`` (the due time, or the
        redelivery); without an age bound, the default budget from the first attempt (from
        ``budget_from_ms`` while none was made: a fire that never got a slot fails too)."""
        if self.max_attempts is not None and attempts >= self.max_attempts:
            return "max_attempts"
        if self.max_age_s is not None:
            if now_ms - budget_from_ms >= self.max_age_s * 1000:
                return "max_age"
        elif gives_up(first_ms if first_ms is not None else budget_from_ms, now_ms, default_for_ms):
            return "max_age"  # the default budget: from the first attempt, else the due time
        return None

    def deadline_ms(self, budget_from_ms: int) -> int | None:
        """When the age bound ends the budget (None: the default's, from the first attempt)."""
        return None if self.max_age_s is None else budget_from_ms + self.max_age_s * 1000


def gives_up(first_attempt_ms: int, now_ms: int, retry_for_ms: int = RETRY_FOR_MS) -> bool:
    """After a retryable failure: is the retry budget spent?"""
    return now_ms - first_attempt_ms >= retry_for_ms
