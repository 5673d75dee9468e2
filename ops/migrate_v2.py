"""One-time migration to the engine's storage format: ``python -m ops.migrate_v2 [--dry-run]``.

The previous format found one-shot timers through wakeup items (shards "0".."31", members
``<partition>:<tenant>|<timer>|<due>|<rev>|<n>|<pv>``, no ``at``) and recurring timers through a
due index on the timers table. The engine finds every live timer through its wake listing
(:mod:`timers.engine.wake`: shard ``partition % 64``, members
``<partition>:<tenant>|<timer>|<rev>|<pos>``, and ``at``, when the item was written). Old and
new items share shard names ("0".."31" are both), so an item is told by its shape: no ``at``
and six-field members is old; ``at`` and four-field members is new. The new migrator cannot
read an old item (a bucket whose shards hold one fails its pass), and nothing reads the old
due index or the old Redis keys (``tq:``) any more.

Run once, right after deploying the engine:

1. scan the wakeups table: the old items, and the listings already written;
2. scan the timers table and write a wake listing for every live timer - what
   :func:`timers.engine.changes.listing_of` returns: active, or owing a claimed fire - at its
   checkpoint, unless that very listing is there already (written by a change since the
   deploy, or by an earlier run of this script);
3. only then delete the old items, so every live timer stays findable throughout.

Idempotent: a second run finds every listing written and nothing old, and writes nothing.
``--dry-run`` scans and counts, and writes nothing. Items of neither shape are counted and left
alone. Redis needs nothing: the new keys start empty, and the fan-out has every bucket restored
from the listings at once (docs/deployment.md).

The target is the local stack (``ENV=local``, default: the running ``make run``) or the
deployed stack named in samconfig.toml (``ENV=aws``, with your AWS credentials), as for
``ops.admin``. Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import boto3

from timers.config import Settings
from timers.engine.changes import listing_of
from timers.engine.wake import Listing, WakeItem, WakeStore
from timers.store.timers_table import PAYLOAD_SUFFIX, TimerItem, to_timer

PROGRESS_EVERY = 10_000


@dataclass
class Report:
    dry_run: bool
    timers_scanned: int = 0  # timer items (payload items and expired timers not counted)
    live_timers: int = 0  # those with a listing to have (active, or owing a fire)
    listings_present: int = 0  # of those, already listed at their checkpoint
    listings_written: int = 0  # listings written (or, dry run, that would be)
    wake_items_written: int = 0  # the items holding them (one per shard and minute)
    old_items_deleted: int = 0  # old-format wakeup items deleted (or that would be)
    unrecognized_items: int = 0  # wakeup items of neither shape: left alone


def item_shape(raw: dict[str, Any]) -> str:
    """``"old"``, ``"new"`` or ``"unknown"``: a wakeup item by its attributes and members."""
    members = [m.get("S", "") for m in raw.get("members", {}).get("L", [])]
    fields = {text.partition(":")[2].count("|") + 1 for text in members}
    if "at" not in raw and fields <= {6}:
        return "old"
    if "at" in raw and fields == {4}:
        return "new"
    return "unknown"


def _scan(client: Any, table: str) -> Iterator[dict[str, Any]]:
    for page in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        yield from page.get("Items", [])


def _listed(raw: dict[str, Any]) -> set[tuple[str, str, int, int]]:
    out = set()
    for member in raw.get("members", {}).get("L", []):
        tenant, timer_id, rev, pos = member["S"].partition(":")[2].split("|")
        out.add((tenant, timer_id, int(rev), int(pos)))
    return out


def _timer_listing(raw: dict[str, Any], now_ms: int) -> tuple[bool, Listing | None]:
    """Whether the item is a timer (not a payload item, not expired: DynamoDB's TTL deletes
    late), and the listing it needs (None: not live)."""
    if PAYLOAD_SUFFIX in raw["timer_id"]["S"]:
        return False, None
    item = TimerItem.from_raw_data(raw)  # decoding needs the schema only, not a table
    expires = item.expires_at
    if expires is not None and expires.timestamp() * 1000 <= now_ms:
        return False, None
    # The payload does not matter here (a big one is in its own item): never read it.
    timer = to_timer(item, payload="" if item.payload is None else None)
    return True, listing_of(timer)


def migrate(
    dynamodb: Any,
    settings: Settings,
    now_ms: int,
    dry_run: bool = False,
    progress: Callable[[str], None] = lambda _: None,
) -> Report:
    """Write the missing wake listings of every live timer, then delete the old wakeup items."""
    wake = WakeStore(settings.wakeups_table, settings.fire_retention_days, dynamodb)
    report = Report(dry_run)

    old: list[WakeItem] = []
    listed: set[tuple[str, str, int, int]] = set()
    for n, raw in enumerate(_scan(dynamodb, settings.wakeups_table), 1):
        shape = item_shape(raw)
        if shape == "old":
            old.append(WakeItem(raw["shard"]["S"], raw["wake"]["S"], [], 0))
        elif shape == "new":
            listed |= _listed(raw)
        else:
            report.unrecognized_items += 1
        if n % PROGRESS_EVERY == 0:
            progress(f"wakeups: {n:,} items read")

    missing: list[Listing] = []
    for n, raw in enumerate(_scan(dynamodb, settings.timers_table), 1):
        is_timer, listing = _timer_listing(raw, now_ms)
        if n % PROGRESS_EVERY == 0:
            progress(f"timers: {n:,} items read")
        report.timers_scanned += is_timer
        if listing is None:
            continue
        report.live_timers += 1
        if (listing.tenant, listing.timer_id, listing.rev, listing.pos) in listed:
            report.listings_present += 1
        else:
            missing.append(listing)

    items = wake.items(missing, now_ms)
    report.listings_written = len(missing)
    report.wake_items_written = len(items)
    report.old_items_deleted = len(old)
    if not dry_run:
        wake.put(items)  # first: a live timer is never without a listing the migrator reads
        progress(f"wrote {len(missing):,} listings in {len(items):,} items")
        wake.delete(old)
        progress(f"deleted {len(old):,} old wakeup items")
    return report


def _retention_days(stack: str, region: str | None) -> int | None:
    """The deployed stack's FireRetentionDays (the listings' TTL follows it)."""
    cfn = boto3.client("cloudformation", region_name=region)
    found = cfn.describe_stacks(StackName=stack)["Stacks"][0].get("Parameters", [])
    value = next((p["ParameterValue"] for p in found if p["ParameterKey"] == "FireRetentionDays"),
                 None)  # fmt: skip
    return int(value) if value else None


def _target() -> Settings:
    from ops import admin  # (its import reads template.yaml: only when run as a command)
    from ops.local.spec import samconfig

    if os.environ.get("ENV", "local") != "aws":
        return admin.local_target().settings
    settings = admin.aws_target().settings
    config = samconfig()
    days = _retention_days(config["stack_name"], config.get("region"))
    return replace(settings, fire_retention_days=days) if days else settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.migrate_v2",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dry-run", action="store_true", help="scan and count; write nothing")
    args = parser.parse_args(argv)
    try:
        settings = _target()
    except Exception as exc:  # no local stack, no stack outputs, no credentials
        print(f"ops.migrate_v2: {exc}", file=sys.stderr)
        return 1
    report = migrate(
        boto3.client("dynamodb"),
        settings,
        time.time_ns() // 1_000_000,
        dry_run=args.dry_run,
        progress=lambda line: print(f"ops.migrate_v2: {line}", file=sys.stderr, flush=True),
    )
    print(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
