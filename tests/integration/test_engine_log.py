"""The fire log's writes against moto (DynamoDB's limits enforced): R1, entries only move
forward - every write is conditional on what it moves from, and nothing removes an entry."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from ops.template import local_settings
from timers.engine.entries import Entry, entry_ref, fence
from timers.engine.log import FireLog, entry_map, to_entry

pytestmark = pytest.mark.integration

REF = entry_ref(7, "tmr_a", 1_795_255_201_000)
KEY, NAME = REF


@pytest.fixture
def log(aws: None) -> Iterator[FireLog]:
    yield FireLog(local_settings().claims_table, retention_days=30, client=boto3.client("dynamodb"))


def stored(log: FireLog) -> Entry | None:
    return log.read_one(REF)


def pending(owner: str = "run-1", until: int = 10_000, rev: int = 1) -> Entry:
    return Entry("p", rev, n=1, owner=owner, until=until)


def test_entries_only_move_forward(log: FireLog) -> None:
    """absent -> pending -> finished; a claim never lands on an existing entry, a record only
    by its owner at its revision, a takeover only over exactly what was read; no write
    removes an entry or moves a finished one back."""
    mine = pending()
    assert log.claim(KEY, {NAME: mine})
    assert not log.claim(KEY, {NAME: pending("run-2")})  # a second claim: refused
    assert stored(log) == mine
    # a record by another owner, or at another revision, is refused
    sent = Entry("d", 1, n=1, enqueued=5)
    assert not log.record(KEY, "run-2", {NAME: sent})
    assert not log.record(KEY, "run-1", {NAME: Entry("d", 2, n=1, enqueued=5)})
    # a takeover must name the claim exactly as it stands
    assert not log.take_over(KEY, NAME, pending("run-3"), pending("run-1", until=9_999))
    assert log.record(KEY, "run-1", {NAME: sent})
    assert stored(log) == sent
    # finished: nothing moves it back - not a claim, a record, a takeover of what it was
    assert not log.claim(KEY, {NAME: pending("run-4")})
    assert not log.record(KEY, "run-1", {NAME: pending()})
    assert not log.take_over(KEY, NAME, pending("run-5"), mine)
    assert stored(log) == sent


def test_a_fence_takes_an_unclaimed_position_and_is_claimed_over_only_by_its_revision(
    log: FireLog,
) -> None:
    client = boto3.client("dynamodb")
    client.transact_write_items(TransactItems=[log.fence_update(REF, fence(2))])
    assert stored(log) == fence(2)
    assert not log.claim(KEY, {NAME: pending(rev=1)})  # a plain claim never lands on it
    assert log.take_over(KEY, NAME, pending(rev=2), fence(2))  # the fresh claim over it
    with pytest.raises(Exception, match="claimed"):
        log.fence_update(REF, fence(3))  # a change now must adopt, not fence


def test_an_adoption_is_written_only_over_the_claim_as_read(log: FireLog) -> None:
    client = boto3.client("dynamodb")
    claim = pending(until=20_000)
    assert log.claim(KEY, {NAME: claim})
    adopted = Entry("p", 2, n=1, owner="run-1", until=20_000, next=42)
    update = log.adopt_update(REF, adopted, claim)
    assert log.record(KEY, "run-1", {NAME: Entry("d", 1, n=1, enqueued=5)})  # it moved on
    with pytest.raises(client.exceptions.TransactionCanceledException):
        client.transact_write_items(TransactItems=[update])
    assert stored(log) == Entry("d", 1, n=1, enqueued=5)


def test_an_entry_round_trips_every_field() -> None:
    entry = Entry("f", 3, n=7, pv=1, owner="o", until=2, enqueued=3, reason="x", fired=4,
                  next=5, end=True, hook=True)  # fmt: skip
    assert to_entry(entry_map(entry)) == entry


def test_a_take_over_of_many_entries_is_one_write_all_or_none(log: FireLog) -> None:
    """Lapsed claims of one item taken over together (a dead run's lease): one conditional
    write replaces each exactly as read - or, if one moved on meanwhile, none."""
    names = [f"tmr_{i}@1000" for i in range(3)]
    dead = {name: pending("run-dead", until=5) for name in names}
    assert log.claim(KEY, dead)
    mine = {name: pending("run-2", until=50_000) for name in names}
    raced = {**{n: (mine[n], dead[n]) for n in names[:2]}, names[2]: (mine[names[2]], pending())}
    assert not log.take_over_many(KEY, raced)  # the third was not as read: nothing changes
    assert log.read([(KEY, n) for n in names], consistent=True) == {
        (KEY, n): dead[n] for n in names
    }
    assert log.take_over_many(KEY, {n: (mine[n], dead[n]) for n in names})
    assert log.read([(KEY, n) for n in names], consistent=True) == {
        (KEY, n): mine[n] for n in names
    }
