"""What the fan-out knows about the trigger's sandboxes, kept in Redis: when it last started a
run of each bucket, and how long a cold trigger takes from invoke to handler (the estimate the
trigger's cold invocations keep up to date, see ``timers.fanout.next_cold_estimate``).

Two small keys with the fan-out's hash tag; a lost key only makes buckets look cold (they are
invoked earlier) or the estimate fall back to its default until the next cold start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from timers.fanout import COLD_DECAY, MAX_COLD_START_MS

RAN_KEY = "tq:{fanout}:ran"  # hash: bucket -> epoch ms the fan-out last started a run of it
COLD_KEY = "tq:{fanout}:cold_ms"  # the cold-start estimate, ms
COLD_TTL_MS = 7 * 86_400_000  # an estimate no cold start refreshed for a week is forgotten

# timers.fanout.next_cold_estimate, in one atomic step (concurrent cold starts all count).
RECORD_LUA = """
local sample = tonumber(ARGV[1])
local prev = tonumber(redis.call('GET', KEYS[1]))
local est = sample
if prev then
  est = math.max(sample, math.floor(prev * ARGV[2] + sample * (1 - ARGV[2]) + 0.5))
end
redis.call('SET', KEYS[1], est, 'PX', ARGV[3])
return est
"""


class WarmthStore:
    def __init__(self, client: Any) -> None:
        self._client = client
        self._record = client.register_script(RECORD_LUA)

    def record_cold_start(self, sample_ms: int) -> int:
        """Fold one cold invocation's delay (invoke -> handler) into the estimate; returns it."""
        sample = min(max(0, int(sample_ms)), MAX_COLD_START_MS)
        return int(self._record([COLD_KEY], [sample, COLD_DECAY, COLD_TTL_MS]))

    def cold_start_ms(self) -> int | None:
        raw = self._client.get(COLD_KEY)
        return None if raw is None else int(raw)

    def last_runs(self) -> dict[int, int]:
        return {int(b): int(ms) for b, ms in self._client.hgetall(RAN_KEY).items()}

    def ran(self, buckets: Sequence[int], at_ms: int) -> None:
        if buckets:
            self._client.hset(RAN_KEY, mapping={b: at_ms for b in buckets})
