"""The HTTP client. Hand-written on the OpenAPI document; ``OPERATIONS`` names the operation
behind each method, and a test checks it - and the models' and parameters' field names - against
the document the API serves, so the two cannot drift."""

from __future__ import annotations

import builtins
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from timers_client.errors import ApiError, error_from
from timers_client.models import (
    FailedFire,
    Fire,
    Group,
    GroupChange,
    Key,
    Page,
    Preview,
    Tenant,
    Timer,
)

T = TypeVar("T")

_UNSET: Any = object()
GROUP_RETRIES = 3
"""A group operation's step that failed on the server's side is made again this many times."""

# SDK method -> (HTTP method, path of the OpenAPI document).
OPERATIONS: dict[str, tuple[str, str]] = {
    "health": ("GET", "/v1/health"),
    "openapi": ("GET", "/v1/openapi.json"),
    "tenant": ("GET", "/v1/tenant"),
    "create": ("POST", "/v1/timers"),
    "create_batch": ("POST", "/v1/timers:batch"),
    "list_page": ("GET", "/v1/timers"),
    "get": ("GET", "/v1/timers/{timer_id}"),
    "patch": ("PATCH", "/v1/timers/{timer_id}"),
    "delete": ("DELETE", "/v1/timers/{timer_id}"),
    "pause": ("POST", "/v1/timers/{timer_id}/pause"),
    "resume": ("POST", "/v1/timers/{timer_id}/resume"),
    "reset": ("POST", "/v1/timers/{timer_id}/reset"),
    "run": ("POST", "/v1/timers/{timer_id}/run"),
    "fires_page": ("GET", "/v1/timers/{timer_id}/fires"),
    "failed_fires_page": ("GET", "/v1/fires"),
    "redeliver": ("POST", "/v1/timers/{timer_id}/fires/{fire_id}/redeliver"),
    "redeliver_all": ("POST", "/v1/timers/{timer_id}/fires:redeliver"),
    "preview": ("POST", "/v1/schedule-preview"),
    "keys": ("GET", "/v1/tenant/keys"),
    "create_key": ("POST", "/v1/tenant/keys"),
    "revoke_key": ("DELETE", "/v1/tenant/keys/{key_id}"),
    "usage": ("GET", "/v1/tenant/usage"),
    "groups_page": ("GET", "/v1/groups"),
    "pause_group": ("POST", "/v1/groups/{name}/pause"),
    "resume_group": ("POST", "/v1/groups/{name}/resume"),
    "delete_group": ("DELETE", "/v1/groups/{name}"),
}
TIMER_FIELDS = ("name", "schedule", "start_at", "end_at", "max_fires", "target", "payload",
                "misfire", "retry", "window_seconds", "group")  # fmt: skip
"""What a create sets and a PATCH may change."""
PARAMETER_OF = {"window_seconds": "window"}
"""A body field the SDK's methods take under a shorter name."""
# Request bodies: SDK method -> (schema name, the method's parameters that fill it).
REQUEST_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "create": ("TimerCreate", TIMER_FIELDS),
    "patch": ("TimerPatch", TIMER_FIELDS),
    "preview": ("PreviewIn", ("schedule", "start_at", "end_at", "max_fires", "count")),
    "create_key": ("KeyCreate", ("label",)),
}


# ---------------------------------------------------------------- schedules


def _rfc3339(when: datetime | str) -> str:
    if isinstance(when, str):
        return when
    if when.tzinfo is None:
        raise ValueError("a datetime needs a time zone (RFC 3339 has an offset)")
    return when.isoformat()


def at(when: datetime | str) -> dict[str, Any]:
    """Once, at ``when`` (an aware datetime or an RFC 3339 string)."""
    return {"type": "at", "at": _rfc3339(when)}


def after(seconds: float) -> dict[str, Any]:
    """Once, ``seconds`` after the request."""
    return {"type": "after", "seconds": seconds}


def every(seconds: float) -> dict[str, Any]:
    """Every ``seconds`` (>= 1)."""
    return {"type": "every", "seconds": seconds}


def cron(expression: str, timezone: str = "UTC") -> dict[str, Any]:
    """Standard 5-field cron in an IANA time zone."""
    return {"type": "cron", "expression": expression, "timezone": timezone}


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config:
    api: str  # the base URL, ending in /v1
    api_key: str | None
    aws_endpoint: str | None = None  # the local stack's moto (for `timers tail`)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Config:
        """``TIMERS_API`` and ``TIMERS_API_KEY``; what they leave out comes from a running
        ``make run`` (its state file: ``$LOCAL_STATE_DIR/stack.json``, else ``.local/stack.json``
        here or in a parent directory) - its API and the demo tenant's key."""
        env = dict(os.environ if env is None else env)
        state = read_state(env)
        api = env.get("TIMERS_API") or (state or {}).get("api_url")
        if not api:
            raise ApiConfigError(
                "set TIMERS_API to the API's base URL (the API: line `make run` prints, or a "
                "deployment's ApiUrl) and TIMERS_API_KEY to a tenant's key: no running `make "
                "run` was found from this directory (or in LOCAL_STATE_DIR)"
            )
        key = env.get("TIMERS_API_KEY")
        from_state = state is not None and state.get("api_url") == api
        if not key and from_state:
            key = (state or {}).get("demo", {}).get("api_key")
        aws = env.get("AWS_ENDPOINT_URL") or (
            (state or {}).get("aws_endpoint") if from_state else None
        )
        return cls(api.rstrip("/"), key, aws)


class ApiConfigError(Exception):
    """No API to talk to."""


def read_state(env: dict[str, str]) -> dict[str, Any] | None:
    """The running local stack's state file, or None (none there, or its stack has stopped)."""
    candidates = []
    if env.get("LOCAL_STATE_DIR"):
        candidates.append(Path(env["LOCAL_STATE_DIR"]) / "stack.json")
    else:
        here = Path.cwd()
        candidates += [p / ".local" / "stack.json" for p in (here, *here.parents)]
    for path in candidates:
        try:
            state: dict[str, Any] = json.loads(path.read_text())
            os.kill(int(state["pid"]), 0)  # a file left by a stack that is gone is ignored
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return state
    return None


# ---------------------------------------------------------------- the client


class Client:
    """One tenant's view of the API (its key). Methods map one to one onto the document's
    operations (``OPERATIONS``); ``list`` and ``fires`` follow ``next_cursor`` for you.

    A 429 is retried up to ``max_retries`` times after its ``Retry-After``; every other
    non-2xx raises an ``ApiError`` subclass with the contract's code and details."""

    def __init__(
        self,
        api: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        headers = {"x-api-key": api_key} if api_key else {}
        headers["user-agent"] = "timers-client/0.1"
        self.api = api.rstrip("/")
        self.max_retries = max_retries
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.api, headers=headers, timeout=timeout, transport=transport
        )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **options: Any) -> Client:
        config = Config.from_env(env)
        return cls(config.api, config.api_key, **options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------ operations

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/health")
        return result

    def openapi(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/openapi.json")
        return result

    def tenant(self) -> Tenant:
        return Tenant.from_json(self._call("GET", "/tenant"))

    def create(
        self,
        schedule: dict[str, Any],
        *,
        name: str | None = None,
        start_at: datetime | str | None = None,
        end_at: datetime | str | None = None,
        max_fires: int | None = None,
        target: dict[str, Any] | None = None,
        payload: Any = None,
        misfire: str | None = None,
        retry: dict[str, Any] | None = None,
        window: float | None = None,
        group: str | None = None,
        idempotency_key: str | None = None,
    ) -> Timer:
        """Create a timer. The same ``idempotency_key`` and body within 24 h give back the
        first timer and create nothing, so a create can be retried safely. ``retry``:
        ``{"max_attempts": 1..100, "max_age_seconds": 60..86400}`` (either optional) bounds
        how long an HTTP fire is retried (HTTP targets only). ``window``: the flexible window
        in seconds (0..900): each fire lands in [due, due + window], batched - cheaper.
        ``group``: the group it joins (1-64 of A-Z a-z 0-9 . _ -), paused, resumed or deleted
        with its other timers (``pause_group`` ...)."""
        body = _body(
            schedule=schedule, name=name, start_at=start_at, end_at=end_at, max_fires=max_fires,
            target=target, payload=payload, misfire=misfire, retry=retry, window_seconds=window,
            group=group,
        )  # fmt: skip
        return Timer.from_json(self._call("POST", "/timers", body, idempotency_key))

    def create_batch(
        self, timers: list[dict[str, Any]], *, idempotency_key: str | None = None
    ) -> list[Timer]:
        """Up to 100 timers (each a create body), all or nothing."""
        answer = self._call("POST", "/timers:batch", {"timers": timers}, idempotency_key)
        return [Timer.from_json(t) for t in answer["items"]]

    def list_page(
        self,
        *,
        status: str | None = None,
        group: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page[Timer]:
        query = _query(status=status, group=group, limit=limit, cursor=cursor)
        answer = self._call("GET", "/timers", query=query)
        return Page([Timer.from_json(t) for t in answer["items"]], answer["next_cursor"])

    def list(
        self, *, status: str | None = None, group: str | None = None, page_size: int = 50
    ) -> Iterator[Timer]:
        """Every timer of the tenant (optionally in one ``status``, of one ``group``), page
        after page."""
        return _every(
            lambda cursor: self.list_page(
                status=status, group=group, limit=page_size, cursor=cursor
            )
        )

    def get(self, timer_id: str) -> Timer:
        return Timer.from_json(self._call("GET", f"/timers/{_id(timer_id)}"))

    def patch(
        self,
        timer_id: str,
        *,
        name: str | None = _UNSET,
        schedule: dict[str, Any] = _UNSET,
        start_at: datetime | str | None = _UNSET,
        end_at: datetime | str | None = _UNSET,
        max_fires: int | None = _UNSET,
        target: dict[str, Any] | None = _UNSET,
        payload: Any = _UNSET,
        misfire: str = _UNSET,
        retry: dict[str, Any] | None = _UNSET,
        window: float = _UNSET,
        group: str | None = _UNSET,
    ) -> Timer:
        """Change the arguments given (None clears an optional field; ``window=0``: on the
        dot; ``group=None``: out of its group); the next fire is recomputed."""
        given = {
            "name": name, "schedule": schedule, "start_at": start_at, "end_at": end_at,
            "max_fires": max_fires, "target": target, "payload": payload, "misfire": misfire,
            "retry": retry, "window_seconds": window, "group": group,
        }  # fmt: skip
        body = {
            k: (_rfc3339(v) if isinstance(v, datetime) else v)
            for k, v in given.items()
            if v is not _UNSET
        }
        return Timer.from_json(self._call("PATCH", f"/timers/{_id(timer_id)}", body))

    def delete(self, timer_id: str) -> None:
        """Cancel: the timer never fires again, and a later ``get`` raises NotFound."""
        self._call("DELETE", f"/timers/{_id(timer_id)}")

    def pause(self, timer_id: str) -> Timer:
        return Timer.from_json(self._call("POST", f"/timers/{_id(timer_id)}/pause"))

    def resume(self, timer_id: str) -> Timer:
        return Timer.from_json(self._call("POST", f"/timers/{_id(timer_id)}/resume"))

    def reset(self, timer_id: str) -> Timer:
        """Restart the schedule from now, fire count 0, whatever the status (an ``at`` whose
        time passed: ValidationError; a fire of it being sent by a run that died: InvalidState)."""
        return Timer.from_json(self._call("POST", f"/timers/{_id(timer_id)}/reset"))

    def run(self, timer_id: str) -> Fire:
        """Fire once now, besides the schedule (whatever the status): the fire, enqueued, with
        its own fire id; it moves no next fire and counts toward no ``max_fires``."""
        return Fire.from_json(self._call("POST", f"/timers/{_id(timer_id)}/run"))

    def fires_page(
        self, timer_id: str, *, limit: int = 50, cursor: str | None = None
    ) -> Page[Fire]:
        query = _query(limit=limit, cursor=cursor)
        answer = self._call("GET", f"/timers/{_id(timer_id)}/fires", query=query)
        return Page([Fire.from_json(f) for f in answer["items"]], answer["next_cursor"])

    def fires(self, timer_id: str, *, page_size: int = 50) -> Iterator[Fire]:
        """The timer's fires, newest first, page after page."""
        return _every(lambda cursor: self.fires_page(timer_id, limit=page_size, cursor=cursor))

    def failed_fires_page(
        self,
        *,
        status: str = "failed",
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        include_redelivered: bool = False,
    ) -> Page[FailedFire]:
        query = _query(
            status=status,
            since=None if since is None else _rfc3339(since),
            until=None if until is None else _rfc3339(until),
            limit=limit,
            cursor=cursor,
            include_redelivered="true" if include_redelivered else None,
        )
        answer = self._call("GET", "/fires", query=query)
        return Page([FailedFire.from_json(f) for f in answer["items"]], answer["next_cursor"])

    def failed_fires(
        self,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        *,
        include_redelivered: bool = False,
        page_size: int = 50,
    ) -> Iterator[FailedFire]:
        """The tenant's failed fires (HTTP targets whose delivery gave up) that failed between
        ``since`` and ``until`` (both included, both optional), newest first, page after page.
        A redelivered one only with ``include_redelivered`` (then with ``redelivered_at``)."""
        return _every(
            lambda cursor: self.failed_fires_page(
                since=since,
                until=until,
                limit=page_size,
                cursor=cursor,
                include_redelivered=include_redelivered,
            )
        )

    def redeliver(self, timer_id: str, fire_id: str) -> FailedFire:
        """Send a failed fire's callback again - the same body and fire id, so consumers still
        dedupe on ``webhook-id`` - with a new retry budget. InvalidState if it is not failed
        (delivered, or redelivered and not failed again); NotFound if there is no such fire."""
        path = f"/timers/{_id(timer_id)}/fires/{_fire_id(fire_id)}/redeliver"
        return FailedFire.from_json(self._call("POST", path))

    def redeliver_all(self, timer_id: str) -> builtins.list[FailedFire]:
        """Redeliver every failed fire of the timer not redelivered yet (at most 100 a call:
        call again while it returns 100)."""
        answer = self._call("POST", f"/timers/{_id(timer_id)}/fires:redeliver")
        return [FailedFire.from_json(f) for f in answer["items"]]

    def preview(
        self,
        schedule: dict[str, Any],
        *,
        start_at: datetime | str | None = None,
        end_at: datetime | str | None = None,
        max_fires: int | None = None,
        count: int | None = None,
    ) -> Preview:
        """The next fire times of a schedule; creates nothing."""
        body = _body(
            schedule=schedule, start_at=start_at, end_at=end_at, max_fires=max_fires, count=count
        )
        return Preview(list(self._call("POST", "/schedule-preview", body)["fire_times"]))

    # ------------------------------------------------------------ groups

    def groups_page(self, *, limit: int = 50, cursor: str | None = None) -> Page[Group]:
        answer = self._call("GET", "/groups", query=_query(limit=limit, cursor=cursor))
        return Page([Group.from_json(g) for g in answer["items"]], answer["next_cursor"])

    def groups(self, *, page_size: int = 50) -> Iterator[Group]:
        """The tenant's groups (those with a timer in them), by name, page after page."""
        return _every(lambda cursor: self.groups_page(limit=page_size, cursor=cursor))

    def pause_group(
        self, name: str, *, on_step: Callable[[GroupChange], None] | None = None
    ) -> GroupChange:
        """Pause every timer of the group: calls until the API says ``done`` (each call
        changes up to 500 timers; ``on_step`` sees each answer). Returns the total; a timer
        already paused is not counted. NotFound: the tenant has no such group."""
        return self._group_steps("POST", f"/groups/{_id(name)}/pause", on_step)

    def resume_group(
        self, name: str, *, on_step: Callable[[GroupChange], None] | None = None
    ) -> GroupChange:
        """Resume every timer of the group (missed fires follow each one's ``misfire``), as
        ``pause_group`` does."""
        return self._group_steps("POST", f"/groups/{_id(name)}/resume", on_step)

    def delete_group(
        self, name: str, *, on_step: Callable[[GroupChange], None] | None = None
    ) -> GroupChange:
        """Delete every timer of the group, as ``pause_group`` does; then the group is gone."""
        return self._group_steps("DELETE", f"/groups/{_id(name)}", on_step)

    def _group_steps(
        self, method: str, path: str, on_step: Callable[[GroupChange], None] | None
    ) -> GroupChange:
        total = 0
        while True:
            step = GroupChange.from_json(self._group_call(method, path))
            total += step.changed
            if on_step is not None:
                on_step(step)
            if step.done:
                return GroupChange(step.group, step.action, total, True)

    def _group_call(self, method: str, path: str) -> Any:
        """One step; a step that failed on the server's side (5xx, a timeout) is made again,
        up to GROUP_RETRIES times: what it changed stays changed and is not counted twice."""
        for attempt in range(GROUP_RETRIES + 1):
            try:
                return self._call(method, path)
            except (ApiError, httpx.TimeoutException) as exc:
                if attempt == GROUP_RETRIES or (isinstance(exc, ApiError) and exc.status < 500):
                    raise
                self._sleep(min(2.0**attempt, 8.0))
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ the tenant's own keys

    def keys(self) -> builtins.list[Key]:
        """The tenant's API keys, oldest first (never their secrets)."""
        return [Key.from_json(k) for k in self._call("GET", "/tenant/keys")["items"]]

    def create_key(self, *, label: str | None = None) -> Key:
        """A new key (at most 10 per tenant: InvalidState); its secret, ``api_key``, is in
        this answer only."""
        return Key.from_json(self._call("POST", "/tenant/keys", _body(label=label)))

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key: refused (401) within 1 s. Never the last one (InvalidState)."""
        self._call("DELETE", f"/tenant/keys/{quote(key_id, safe='')}")

    def usage(self, month: str | None = None) -> dict[str, Any]:
        """The tenant's usage of ``month`` (``YYYY-MM``, UTC; default: this month): fires
        enqueued, delivered, failed and late by more than 1 s; ``lag``, the enqueued fires by
        accuracy level (``ontime``, ``1-200ms``, ``200-600ms``, ``600-1000ms``,
        ``1000-2000ms``, ``over_2000ms``: they add up to enqueued); timers created; active
        now."""
        result: dict[str, Any] = self._call("GET", "/tenant/usage", query=_query(month=month))
        return result

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        idempotency_key: str | None = None,
        query: dict[str, Any] | None = None,
    ) -> Any:
        headers = {"idempotency-key": idempotency_key} if idempotency_key else {}
        content = None
        if body is not None:
            headers["content-type"] = "application/json"
            content = json.dumps(body).encode()
        attempt = 0
        while True:
            response = self._http.request(
                method, path, content=content, headers=headers, params=query
            )
            if response.status_code == 429 and attempt < self.max_retries:
                self._sleep(_retry_after(response, attempt))
                attempt += 1
                continue
            break
        if response.status_code == 204:
            return None
        try:
            answer = response.json()
        except ValueError:
            answer = response.text
        if response.is_success:
            return answer
        retry = _retry_after(response, attempt) if response.status_code == 429 else None
        raise error_from(response.status_code, answer, retry)


NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
"""A number as the SDK and the CLI read one: ASCII digits. ``float()`` takes any script's, and
``inf``, ``nan``, ``1e9`` and ``1_0`` too."""


def _retry_after(response: httpx.Response, attempt: int) -> float:
    """``Retry-After`` in seconds (API Gateway's own 429 has none, and an HTTP date or anything
    else that is not a number in ASCII digits is no answer: back off exponentially)."""
    given = response.headers.get("retry-after", "").strip()
    if NUMBER.fullmatch(given):
        return float(given)
    return min(2.0**attempt * 0.5, 8.0)


def _id(timer_id: str) -> str:
    return quote(timer_id, safe="")


def _every(page: Callable[[str | None], Page[T]]) -> Iterator[T]:
    """Every item of a listing, following ``next_cursor`` page after page."""
    cursor = None
    while True:
        got = page(cursor)
        yield from got.items
        if got.next_cursor is None:
            return
        cursor = got.next_cursor


def _fire_id(fire_id: str) -> str:
    """``<timer id>:<due ms>``: the colon is a valid path character, left as it is."""
    return quote(fire_id, safe=":")


def _body(**fields: Any) -> dict[str, Any]:
    return {
        k: (_rfc3339(v) if isinstance(v, datetime) else v)
        for k, v in fields.items()
        if v is not None
    }


def _query(**params: Any) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


__all__ = ["OPERATIONS", "ApiConfigError", "ApiError", "Client", "Config"]
