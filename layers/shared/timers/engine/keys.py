"""Every Redis key name the service uses, in one place.

A bucket's keys share the hash tag ``{b<n>}``: each script touches one slot (ElastiCache
cluster mode and Serverless refuse cross-slot scripts) and nothing is shared by all buckets.
The prefix names the key format (``tq2``); keys of another prefix are never read.
"""

from __future__ import annotations

PREFIX = "tq2"
SENTINEL = "#"  # data field: "ok" once the bucket holds what DynamoDB says, "r<ms>" restoring
RAN = "#ran"  # data field: when the fan-out last started a run of the bucket (epoch ms)
COLD = "#cold"  # data field: the bucket's trigger cold-start estimate (ms)
RESUME = "#resume"  # data field: where the migrator's cycle over the bucket's listings goes on


def due(bucket: int) -> str:
    """zset: member ``tenant|timer`` -> when it may next be leased; and ``tenant|timer|rev`` ->
    NOTED + when that revision's chain ended (never leased: the migrator's note that its
    listings are dead)."""
    return f"{PREFIX}:{{b{bucket}}}:due"


def data(bucket: int) -> str:
    """hash: member -> its card; and the bucket's own fields (names start with '#')."""
    return f"{PREFIX}:{{b{bucket}}}:data"


def tags(bucket: int) -> str:
    """zset: tenant -> the last fair tag it was queued at, while the bucket's fair queue lives
    (lua/lease.lua: members queued behind a crowd are re-scored to tags below every time)."""
    return f"{PREFIX}:{{b{bucket}}}:tags"


def tails(bucket: int) -> str:
    """hash: tenant -> its member queued at its last tag (``tags``), while the fair queue lives:
    a tenant whose tail left the queue by a change re-enters at the queue's head."""
    return f"{PREFIX}:{{b{bucket}}}:tails"


def run(bucket: int, slot: int) -> str:
    """string: a trigger run of the bucket is queued or going in this slot (its token)."""
    return f"{PREFIX}:{{b{bucket}}}:run:{slot}"


def rate(who: str, window_s: int) -> str:
    """string: requests of a tenant (or an address) in one second (the api's rate limit)."""
    return f"rl:{{{who}}}:{window_s}"
