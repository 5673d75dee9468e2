"""Every Redis key name of the fire path, in one place (what each holds: "Data model" in
docs/fire-path.md). A bucket's keys share the hash tag ``{b<n>}``: each script touches one slot
(ElastiCache cluster mode and Serverless refuse cross-slot scripts). The prefix names the key
format (``tq2``); keys of another prefix are never read.
"""

from __future__ import annotations

PREFIX = "tq2"
SENTINEL = "#"  # data field: "ok" once the bucket holds what DynamoDB says, "r<ms>" restoring
RAN = "#ran"  # data field: when the fan-out last started a run of the bucket (epoch ms)
COLD = "#cold"  # data field: the bucket's trigger cold-start estimate (ms)
RESUME = "#resume"  # data field: where the migrator's cycle over the bucket's listings goes on


def due(bucket: int) -> str:
    """zset: member -> when it may next be leased; ended-chain notes (index.NOTED)."""
    return f"{PREFIX}:{{b{bucket}}}:due"


def data(bucket: int) -> str:
    """hash: member -> its card; and the bucket's own fields (names start with '#')."""
    return f"{PREFIX}:{{b{bucket}}}:data"


def tags(bucket: int) -> str:
    """zset: tenant -> the last fair tag it was queued at (lua/lease.lua)."""
    return f"{PREFIX}:{{b{bucket}}}:tags"


def tails(bucket: int) -> str:
    """hash: tenant -> its member queued at its last tag (``tags``)."""
    return f"{PREFIX}:{{b{bucket}}}:tails"


def run(bucket: int, slot: int) -> str:
    """string: a trigger run of the bucket is queued or going in this slot (its token)."""
    return f"{PREFIX}:{{b{bucket}}}:run:{slot}"
