"""Groups through the real handler (moto + real Redis): the `group` field, the group listing
and filter, and the group operations - each timer changed as its single route changes it,
only the group's timers read, tenants walled off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.api_harness import Api, make_api
from tests.support.chains import fire
from tests.support.clock import T0, FakeClock
from timers.core.times import format_ms
from timers.engine.changes import CREATE_MS
from timers.engine.entries import ref_of

EVERY = {"type": "every", "seconds": 60}


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    yield make_api(monkeypatch, clock, redis_url)


def in_group(api: Api, n: int, group: str | None, tenant: str = "acme", **more: Any) -> list[str]:
    body = {"timers": [{"schedule": EVERY, "group": group, **more} for _ in range(n)]}
    reply = api.call("POST", "/v1/timers:batch", tenant=tenant, body=body)
    assert reply.status == 201, reply.body
    return [t["id"] for t in reply.body["items"]]


def listed(api: Api, group: str, tenant: str = "acme", **query: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"group": group, "limit": "7", **query, **({"cursor": cursor} if cursor else {})}
        reply = api.call("GET", "/v1/timers", tenant=tenant, query=params)
        assert reply.status == 200, reply.body
        items += reply.body["items"]
        cursor = reply.body["next_cursor"]
        if cursor is None:
            return items


def operate(api: Api, action: str, group: str, tenant: str = "acme") -> dict[str, Any]:
    method, suffix = ("DELETE", "") if action == "delete" else ("POST", f"/{action}")
    reply = api.call(method, f"/v1/groups/{group}{suffix}", tenant=tenant)
    assert reply.status == 200, reply.body
    return dict(reply.body)


def status_of(api: Api, timer_id: str) -> str | None:
    reply = api.call("GET", f"/v1/timers/{timer_id}")
    return reply.body["status"] if reply.status == 200 else None


# ---------------------------------------------------------------- the group field


def test_a_timer_joins_moves_and_leaves_a_group(api: Api) -> None:
    timer = api.create(schedule=EVERY, group="order-1234")
    assert timer["group"] == "order-1234"
    assert api.call("GET", f"/v1/timers/{timer['id']}").body["group"] == "order-1234"
    assert api.create(schedule=EVERY)["group"] is None
    assert [t["id"] for t in listed(api, "order-1234")] == [timer["id"]]
    moved = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"group": "order-99"})
    assert (moved.status, moved.body["group"]) == (200, "order-99")
    assert listed(api, "order-1234") == []
    assert [t["id"] for t in listed(api, "order-99")] == [timer["id"]]
    left = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"group": None})
    assert (left.status, left.body["group"]) == (200, None)
    assert listed(api, "order-99") == []
    kept = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"name": "n"})
    assert kept.body["group"] is None  # a PATCH without group keeps it


def test_a_batch_creates_into_groups_and_the_filter_pages_with_status(api: Api) -> None:
    ids = in_group(api, 20, "campaign.7_a")
    in_group(api, 5, None)
    in_group(api, 3, "other")
    assert sorted(t["id"] for t in listed(api, "campaign.7_a")) == sorted(ids)
    api.call("POST", f"/v1/timers/{ids[3]}/pause")
    paused = listed(api, "campaign.7_a", status="paused")
    assert [t["id"] for t in paused] == [ids[3]]
    assert all(t["group"] == "campaign.7_a" for t in listed(api, "campaign.7_a"))


BAD_GROUPS = ["a b", "a/b", "x" * 65, "", "naïve", "a\n", 7, True, ["a"], {"a": 1}]


@pytest.mark.parametrize("group", BAD_GROUPS, ids=repr)
def test_a_bad_group_is_400_on_group_and_changes_nothing(api: Api, group: Any) -> None:
    reply = api.call("POST", "/v1/timers", body={"schedule": EVERY, "group": group})
    assert (reply.status, reply.error_code) == (400, "validation_error"), reply.body
    assert reply.error_fields == {"group"}
    assert set(reply.body["error"]) == {"code", "message", "details"}
    batch = api.call("POST", "/v1/timers:batch", body={"timers": [
        {"schedule": EVERY, "group": "fine"}, {"schedule": EVERY, "group": group}]})  # fmt: skip
    assert (batch.status, batch.error_fields) == (400, {"timers[1].group"}), batch.body
    assert api.call("GET", "/v1/timers").body["items"] == []
    timer = api.create(schedule=EVERY, group="fine")
    patched = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"group": group})
    assert (patched.status, patched.error_fields) == (400, {"group"}), patched.body
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer
    assert [g["name"] for g in api.call("GET", "/v1/groups").body["items"]] == ["fine"]


@pytest.mark.parametrize("name", ["a%20b", "x" * 65, "na%C3%AFve"])
def test_a_bad_group_name_in_a_path_or_query_is_400_on_group(api: Api, name: str) -> None:
    timer = api.create(schedule=EVERY)
    for method, path in [("POST", f"/v1/groups/{name}/pause"), ("DELETE", f"/v1/groups/{name}")]:
        reply = api.call(method, path)
        assert (reply.status, reply.error_fields) == (400, {"group"}), reply.body
    from urllib.parse import unquote

    reply = api.call("GET", "/v1/timers", query={"group": unquote(name)})
    assert (reply.status, reply.error_fields) == (400, {"group"}), reply.body
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer


# ---------------------------------------------------------------- the listing


def test_groups_are_listed_by_name_while_a_timer_is_in_them(api: Api) -> None:
    assert api.clock() == T0
    b = in_group(api, 2, "b")
    api.clock.advance(1_000)
    in_group(api, 1, "a")
    in_group(api, 1, "c")
    in_group(api, 1, "mine", tenant="globex")
    body = api.call("GET", "/v1/groups").body
    assert body == {
        "items": [
            {"name": "a", "created_at": format_ms(T0 + 1_000)},
            {"name": "b", "created_at": format_ms(T0)},
            {"name": "c", "created_at": format_ms(T0 + 1_000)},
        ],
        "next_cursor": None,
    }
    page = api.call("GET", "/v1/groups", query={"limit": "2"}).body
    assert [g["name"] for g in page["items"]] == ["a", "b"]
    rest = api.call("GET", "/v1/groups", query={"limit": "2", "cursor": page["next_cursor"]})
    assert [g["name"] for g in rest.body["items"]] == ["c"]
    foreign = api.call("GET", "/v1/groups", tenant="globex", query={"cursor": page["next_cursor"]})
    assert foreign.status == 400  # a cursor is its tenant's
    for timer_id in b:  # emptied one by one: the group is gone
        api.call("DELETE", f"/v1/timers/{timer_id}")
    assert [g["name"] for g in api.call("GET", "/v1/groups").body["items"]] == ["a", "c"]
    api.clock.advance(CREATE_MS + 1)  # past a create in flight: its record goes too
    api.call("GET", "/v1/groups")
    assert api.runtime.groups.groups.get("acme", "b") is None
    assert api.runtime.groups.groups.get("acme", "a") is not None


# ---------------------------------------------------------------- operations


def test_pause_resume_and_delete_a_group(api: Api) -> None:
    ids = in_group(api, 6, "order-1")
    others = in_group(api, 2, None) + in_group(api, 2, "order-2")
    api.call("POST", f"/v1/timers/{ids[0]}/pause")  # already paused: not counted
    assert operate(api, "pause", "order-1") == {
        "group": "order-1", "action": "pause", "changed": 5, "done": True
    }  # fmt: skip
    assert {status_of(api, i) for i in ids} == {"paused"}
    assert {status_of(api, i) for i in others} == {"active"}
    assert operate(api, "pause", "order-1")["changed"] == 0
    assert operate(api, "resume", "order-1") == {
        "group": "order-1", "action": "resume", "changed": 6, "done": True
    }  # fmt: skip
    assert {status_of(api, i) for i in ids} == {"active"}
    assert operate(api, "delete", "order-1") == {
        "group": "order-1", "action": "delete", "changed": 6, "done": True
    }  # fmt: skip
    assert {status_of(api, i) for i in ids} == {None}
    assert {status_of(api, i) for i in others} == {"active"}
    gone = api.call("DELETE", "/v1/groups/order-1")
    assert (gone.status, gone.error_code) == (404, "not_found")
    assert [g["name"] for g in api.call("GET", "/v1/groups").body["items"]] == ["order-2"]


def test_a_group_operation_is_the_single_routes_change(api: Api) -> None:
    """The same revision, status, cursor and Redis card as the single route's: pause takes
    the card out of Redis, resume follows misfire, delete fences the cursor."""
    grouped = api.create(schedule={"type": "every", "seconds": 60}, misfire="skip", group="g")
    single = api.create(schedule={"type": "every", "seconds": 60}, misfire="skip")
    operate(api, "pause", "g")
    api.call("POST", f"/v1/timers/{single['id']}/pause")
    api.clock.advance(150_000)
    operate(api, "resume", "g")
    api.call("POST", f"/v1/timers/{single['id']}/resume")
    a = api.call("GET", f"/v1/timers/{grouped['id']}").body
    b = api.call("GET", f"/v1/timers/{single['id']}").body
    assert a["next_fire_at"] == b["next_fire_at"] == "2026-11-21T10:03:00.000Z"
    assert (a["status"], b["status"]) == ("active", "active")
    store = api.runtime.service.timers
    stored = store.get("acme", grouped["id"])
    assert stored.rev == store.get("acme", single["id"]).rev == 3
    operate(api, "delete", "g")
    ref = ref_of(stored, stored.next_fire_ms)
    entry = api.runtime.wiring.log.read([ref], consistent=True)[ref]
    assert entry is not None and entry.state == "t"  # fenced: a stale card cannot claim it


def test_completed_and_claimed_timers_in_a_group(api: Api) -> None:
    """A completed timer cannot be paused: skipped, not counted. A fire claimed before the
    delete is owed (adopted, ending its chain), as for the single delete."""
    done = in_group(api, 1, "g", max_fires=1)[0]
    fire(api.runtime.wiring.log, api.runtime.service.timers.get("acme", done), 1)
    claimed = in_group(api, 1, "g")[0]
    timer = api.runtime.service.timers.get("acme", claimed)
    log = api.runtime.wiring.log
    from timers.engine.entries import Entry

    ref = ref_of(timer, timer.next_fire_ms)
    pending = Entry(state="p", rev=timer.rev, n=1, owner="run", until=T0 + 90_000)
    assert log.claim(ref[0], {ref[1]: pending})
    assert status_of(api, done) == "completed"
    assert operate(api, "pause", "g")["changed"] == 1  # the claimed one; not the completed
    assert operate(api, "delete", "g")["changed"] == 2
    owed = log.read([ref], consistent=True)[ref]
    assert owed is not None and owed.state == "p" and owed.end  # still sent by its run


def test_a_big_group_goes_in_steps_each_call_going_on_where_the_last_stopped(api: Api) -> None:
    ops = api.runtime.groups
    ops.change_limit = 4
    ids = sorted(in_group(api, 10, "big"))
    api.call("POST", f"/v1/timers/{ids[1]}/pause")
    seen: list[str] = []
    change = ops.changes.change

    def spy(tenant: str, timer_id: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(timer_id)
        return change(tenant, timer_id, *args, **kwargs)

    ops.changes.change = spy  # type: ignore[method-assign]
    calls = []
    while not calls or not calls[-1]["done"]:
        calls.append(operate(api, "pause", "big"))
    assert [c["changed"] for c in calls] == [4, 4, 1]
    assert [c["done"] for c in calls] == [False, False, True]
    assert sorted(seen) == ids  # each read once: no call started over
    assert {status_of(api, i) for i in ids} == {"paused"}
    assert api.runtime.groups.groups.get("acme", "big").op is None  # finished
    seen.clear()
    assert operate(api, "resume", "big")["changed"] == 4  # another action starts afresh
    assert sorted(seen) == ids[:4]
    assert operate(api, "pause", "big")["changed"] == 4  # ... and so does the first again
    api.clock.advance(61_000)  # a call long after the last starts over
    seen.clear()
    reply = operate(api, "resume", "big")
    assert seen[:4] == ids[:4] and reply["changed"] == 4


def test_a_call_reads_only_the_groups_timers(api: Api) -> None:
    """Indexed, not scanned: a listing and an operation read the group's timers only."""
    in_group(api, 30, None)
    in_group(api, 30, "noise")
    ids = in_group(api, 3, "small")
    store = api.runtime.service.timers
    read: list[str] = []
    get_many, get = store.get_many, store.get

    def counting_many(keys: Any, consistent: bool = True) -> Any:
        keys = list(keys)
        read.extend(k[1] for k in keys)
        return get_many(keys, consistent)

    def counting(tenant: str, timer_id: str, consistent: bool = True) -> Any:
        read.append(timer_id)
        return get(tenant, timer_id, consistent)

    store.get_many, store.get = counting_many, counting
    page, store.page = store.page, None  # the tenant's whole listing is never read
    try:
        assert len(listed(api, "small")) == 3
        operate(api, "pause", "small")
        operate(api, "delete", "small")
    finally:
        store.page = page
    assert set(read) == set(ids)


def test_tenants_are_walled_off(api: Api) -> None:
    ours = in_group(api, 2, "shared-name")
    theirs = in_group(api, 2, "shared-name", tenant="globex")
    assert operate(api, "delete", "shared-name")["changed"] == 2
    assert {status_of(api, i) for i in ours} == {None}
    globex = [api.call("GET", f"/v1/timers/{i}", tenant="globex").body["status"] for i in theirs]
    assert globex == ["active", "active"]
    assert listed(api, "shared-name") == []
    assert len(listed(api, "shared-name", tenant="globex")) == 2
    for method, path in [("POST", "/v1/groups/only-theirs/pause"),
                         ("POST", "/v1/groups/only-theirs/resume"),
                         ("DELETE", "/v1/groups/only-theirs")]:  # fmt: skip
        in_group(api, 1, "only-theirs", tenant="globex")
        reply = api.call(method, path)
        assert (reply.status, reply.error_code) == (404, "not_found"), reply.body
        assert set(reply.body["error"]) == {"code", "message", "details"}
    assert [g["name"] for g in api.call("GET", "/v1/groups").body["items"]] == []


def test_a_timer_that_left_the_group_after_the_index_listed_it_is_not_changed(api: Api) -> None:
    """The index is read eventually consistent: each timer is checked on the revision its
    change commits against."""
    ids = in_group(api, 2, "g")
    store = api.runtime.service.timers
    group_ids = store.group_ids

    def stale(tenant: str, group: str, after: str | None, limit: int) -> Any:
        found = group_ids(tenant, group, after, limit)
        api.call("PATCH", f"/v1/timers/{ids[0]}", body={"group": "elsewhere"})
        return found

    store.group_ids = stale
    try:
        assert operate(api, "delete", "g")["changed"] == 1
    finally:
        store.group_ids = group_ids
    assert status_of(api, ids[0]) == "active"
    assert status_of(api, ids[1]) is None


def test_export_carries_the_group(api: Api) -> None:
    timer = api.create(schedule=EVERY, group="keep")
    assert api.call("GET", "/v1/timers").body["items"][0]["group"] == "keep"
    assert timer["group"] == "keep"


def test_a_call_starts_no_chunk_it_would_not_end_within_its_budget(api: Api) -> None:
    """Judged by its slowest chunk so far: each answer comes well within the api's timeout,
    however slow each change is."""
    ops = api.runtime.groups
    ops.chunk, ops.budget_ms = 3, 1_000
    ids = in_group(api, 8, "slow")
    change = ops.changes.change

    def slow(*args: Any, **kwargs: Any) -> Any:
        api.clock.advance(150)  # each change takes 150 ms: a chunk of 3, 450 ms
        return change(*args, **kwargs)

    ops.changes.change = slow  # type: ignore[method-assign]
    started = api.clock()
    first = operate(api, "pause", "slow")
    # 450 ms a chunk: a second would end at 900 (room for one twice as slow: 1,350 > 1,000)
    assert (first["changed"], first["done"]) == (3, False)
    assert api.clock() - started == 450
    assert [operate(api, "pause", "slow")["changed"] for _ in range(2)] == [3, 2]
    assert {status_of(api, i) for i in ids} == {"paused"}


def test_a_change_made_after_the_chunk_was_read_wins_over_that_read(api: Api) -> None:
    """A chunk's timers are read together before their changes: a timer moved out of the
    group, or paused and resumed, after that read fails its change's transaction (its revision
    moved), which reads afresh and sees it."""
    ids = in_group(api, 2, "g")
    ops = api.runtime.groups
    walks = ops.changes.walks
    raced: list[bool] = []

    def racing(stored: Any, consistent: bool) -> Any:
        found = walks(stored, consistent)
        if not raced:
            raced.append(True)
            api.call("PATCH", f"/v1/timers/{ids[0]}", body={"group": "elsewhere"})
        return found

    ops.changes.walks = racing  # type: ignore[method-assign]
    try:
        assert operate(api, "delete", "g")["changed"] == 1
    finally:
        ops.changes.walks = walks  # type: ignore[method-assign]
    assert status_of(api, ids[0]) == "active"
    assert status_of(api, ids[1]) is None
