"""Redis: the index of what is due soon, one member (``tenant|timer``) per timer, in buckets
(keys in :mod:`timers.engine.keys`, scripts in ``lua/``; "Data model" in docs/fire-path.md).
Only an index - DynamoDB is the truth: every operation is safe to repeat, and what Redis loses
the migrator restores. A lease is a later score, not a record: a dead run's members come back.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from timers.core.schedule import schedule_from_dict, schedule_to_dict
from timers.core.timer import Timer
from timers.core.webhooks import RetryPolicy, Webhook
from timers.core.window import grain_for, send_at
from timers.engine import keys
from timers.engine.entries import path_hash
from timers.store.redis_scripts import RedisPort, Script, as_text

LUA = Path(__file__).parent / "lua"
CHUNK = 500  # members per script call: bounds how long one call blocks Redis (and Lua's unpack)
ENDED = 9_999_999_999_999  # the checkpoint lua/check.lua answers for a revision's ended chain
NOTED = 10**13  # ended-chain notes' scores start here (year 2286): never leased, never a head
ADMIT = 4_000  # members a lease queues fairly at most ("Fairness" in docs/fire-path.md)
RUN_BEAT_MS = 1_000  # a leasing run promises its next beat within this (or another run starts)
CARD_FIELDS = {  # a card's JSON key -> the timer's field it holds as is
    "a": "anchor_ms",
    "st": "start_ms",
    "en": "end_ms",
    "mx": "max_fires",
    "mf": "misfire",
    "q": "target_queue_url",
    "nm": "name",
    "p": "payload_json",
    "b": "partition",
    "z": "status",
}


def member_of(tenant: str, timer_id: str) -> str:
    return f"{tenant}|{timer_id}"


@dataclass(frozen=True)
class Card:
    """A timer in Redis: what a fire needs of it, the chain position it is at (``pos``, the
    fires ``n`` before it, the position ``pv`` before it) and its checkpoint as last written
    (``ckpt``: wake listings before it are dead, which the migrator learns without DynamoDB)."""

    timer: Timer
    pos: int
    n: int = 0
    pv: int | None = None
    ckpt: int = 0

    @property
    def member(self) -> str:
        return member_of(self.timer.tenant, self.timer.id)

    @property
    def due_at(self) -> int:
        """When its fire is sent, its score in ``due`` while it waits: its position, or an
        aligned instant within its window ("The flexible window" in docs/fire-path.md)."""
        t = self.timer
        return send_at(self.pos, t.window_ms, t.grain_ms, t.partition)

    @property
    def score(self) -> float:
        """The send instant - with a window, plus a fraction of a ms by its fire-log path: an
        aligned instant's crowd is leased in the order its claim items fill (docs/fire-path.md)."""
        aligned = grain_for(self.timer.window_ms)  # (a window under 1 s is on the dot)
        order = int(path_hash(self.timer.id)[:2], 16) / 256 if aligned else 0
        return self.due_at + order

    def at(self, pos: int, n: int, pv: int | None, ckpt: int | None = None) -> Card:
        return replace(self, pos=pos, n=n, pv=pv, ckpt=self.ckpt if ckpt is None else ckpt)

    def encode(self) -> str:
        """``rev|pos|n|pv|ckpt|<json>``: the scripts read revision and position by prefix."""
        t = self.timer
        body: dict[str, Any] = {"s": schedule_to_dict(t.schedule)}
        body.update((key, getattr(t, name)) for key, name in CARD_FIELDS.items())
        if t.webhook is not None:
            body["w"] = t.webhook.to_dict()
        if t.retry is not None:
            body["r"] = t.retry.to_dict()
        if t.window_ms:
            body["wn"] = t.window_ms
        if t.grain_ms:
            body["gr"] = t.grain_ms
        pv = "" if self.pv is None else self.pv
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        return f"{t.rev}|{self.pos}|{self.n}|{pv}|{self.ckpt}|{text}"

    @classmethod
    def decode(cls, member: str, text: str) -> Card:
        tenant, timer_id = member.split("|", 1)
        rev, pos, n, pv, ckpt, raw = text.split("|", 5)
        b = json.loads(raw)
        webhook = Webhook(b["w"]["url"], tuple(b["w"]["headers"].items())) if "w" in b else None
        timer = Timer(
            tenant=tenant,
            id=timer_id,
            schedule=schedule_from_dict(b["s"]),
            rev=int(rev),
            webhook=webhook,
            retry=RetryPolicy.from_dict(b.get("r")),
            window_ms=b.get("wn", 0),
            grain_ms=b.get("gr", 0),
            **{name: b[key] for key, name in CARD_FIELDS.items()},
        )
        return cls(timer, int(pos), int(n), int(pv) if pv else None, int(ckpt))


class Leased(NamedTuple):
    cards: list[Card]
    next_due: int | None  # the bucket's earliest score after the lease


class Peek(NamedTuple):
    """A bucket as the fan-out sees it."""

    head: int | None  # the earliest score: a due member or a lease that ends
    backlog: int  # members leasable by the time asked
    sentinel: str | None
    ran: int | None
    cold: int | None


SHARD_WAIT_S = 0.1  # a cluster-mode peek's wait for each shard (Durations in docs/fire-path.md)


class PeekPending(Exception):
    """The bucket's shard has not answered within SHARD_WAIT_S: no news this poll (not down)."""


Call = tuple[list[str], list[Any]]


class BucketIndex:
    def __init__(self, client: RedisPort, bucket_count: int) -> None:
        if bucket_count < 1:
            raise ValueError("bucket_count must be >= 1")
        self.client = client
        self.bucket_count = bucket_count
        self._scripts = {
            name: Script(client, LUA, name, "bulk")
            for name in ("put", "lease", "finish", "check", "token", "swap", "start")
        }
        self._shard_pool: ThreadPoolExecutor | None = None
        self._shard_peeks: dict[str, Future[dict[int, Peek | Exception]]] = {}

    def bucket_of(self, partition: int) -> int:
        return partition % self.bucket_count

    def _keys(self, bucket: int) -> list[str]:
        if not 0 <= bucket < self.bucket_count:
            raise ValueError(f"bucket {bucket} outside 0..{self.bucket_count - 1}")
        return [keys.due(bucket), keys.data(bucket)]

    # ---------------------------------------------------------------- adding, dropping

    def put(self, cards: Iterable[Card], keep_lease: bool = False) -> int:
        """Store each card where it is newer than what the bucket holds (a later revision, or a
        later position of the same one), leasable from its ``score`` - or, ``keep_lease`` (a
        change adopting a claimed fire), from a stored member's score raised to its ``score``
        (lua/put.lua). Returns how many."""
        keep = "k" if keep_lease else ""  # lua/put.lua: keep the stored score
        rows = [
            (c.timer.partition, [c.member, c.timer.rev, c.pos, c.encode(), f"{keep}{c.score}"])
            for c in cards
        ]
        return sum(int(r[0]) for r in self._per_bucket("put", rows))

    def drop(self, partition: int, member: str, rev: int) -> None:
        """A change made the timer inactive or deleted it: its card leaves, unless a revision
        no older than ``rev`` is stored."""
        self._per_bucket("put", [(partition, [member, rev, 0, "", 0])])

    def revisions(self, checks: Sequence[tuple[int, str, int]]) -> list[tuple[int, int]]:
        """For each (partition, member, rev), its card's revision and checkpoint; where it has
        no card, (rev, ENDED) if that revision's chain ended, else (-1, -1)."""
        by_bucket: dict[int, list[int]] = defaultdict(list)
        for i, (partition, _, _) in enumerate(checks):
            by_bucket[self.bucket_of(partition)].append(i)
        out = [(-1, -1)] * len(checks)
        for bucket, indexes in by_bucket.items():
            for start in range(0, len(indexes), CHUNK):
                part = indexes[start : start + CHUNK]
                args = [a for i in part for a in checks[i][1:]]
                got = self._eval("check", [([keys.data(bucket), keys.due(bucket)], args)])[0]
                for n, i in enumerate(part):
                    out[i] = (int(got[2 * n]), int(got[2 * n + 1]))
        return out

    def forget_ended(self, bucket: int, names: Sequence[str], before: int) -> None:
        """Drop the ended-chain notes of ``names`` (``member|rev``: their listings are gone) and
        any older than ``before`` (a note nobody asked for)."""
        pipe = self.client.pipeline(transaction=False)
        if names:
            pipe.execute_command("ZREM", keys.due(bucket), *names)
        pipe.execute_command("ZREMRANGEBYSCORE", keys.due(bucket), NOTED, f"({NOTED + before}")
        pipe.execute()

    # ---------------------------------------------------------------- the trigger's side

    def lease(
        self, bucket: int, until: int, lease_end: int, limit: int, scan: int = 0,
        admit: int = ADMIT,
    ) -> Leased:  # fmt: skip
        """Lease up to ``limit`` members leasable by ``until``, fairly across tenants (see
        lua/lease.lua), each leasable again from ``lease_end`` unless settled first."""
        args = [until, lease_end, limit, scan or 4 * max(1, limit), admit]
        call_keys = [*self._keys(bucket), keys.tags(bucket), keys.tails(bucket)]
        members, cards, first = self._eval("lease", [(call_keys, args)])[0]
        return Leased(
            [Card.decode(as_text(m), as_text(c)) for m, c in zip(members, cards, strict=True)],
            _score(first),
        )

    def settle(
        self, bucket: int, moves: Sequence[tuple[Card, Card | None, int]],
        ended: Collection[str] = (), now: int = 0,
    ) -> int | None:  # fmt: skip
        """Move each leased card on to the next (leasable from its ``score``) or drop it (None),
        if it is still at the position leased and of no newer revision than the one given (a
        change since owns it); a dropped member in ``ended`` notes (at ``now``) that its
        revision's chain ended. Returns the bucket's earliest score."""
        args: list[Any] = []
        for card, following, rev in moves:
            drop = "!" if card.member in ended else ""
            args += [
                card.member,
                card.pos,
                rev,
                drop if following is None else following.encode(),
                NOTED + now if following is None else following.score,
            ]
        return self._finish(bucket, args)

    def release(self, bucket: int, scores: Mapping[Card, int]) -> int | None:
        """Make leased members leasable again from their score (if still at their position)."""
        args: list[Any] = []
        for card, score in scores.items():
            args += [card.member, card.pos, -1, "=", score]
        return self._finish(bucket, args)

    def _finish(self, bucket: int, args: list[Any]) -> int | None:
        if not args:
            return None
        calls = [
            (self._keys(bucket), args[i : i + 5 * CHUNK]) for i in range(0, len(args), 5 * CHUNK)
        ]
        return _score(self._eval("finish", calls)[-1])

    # ---------------------------------------------------------------- the fan-out's side

    def peek(
        self, buckets: Sequence[int], until: int, wait_s: float | None = SHARD_WAIT_S
    ) -> dict[int, Peek | Exception]:
        """Every bucket's head, sentinel and warmth in one round trip of plain commands (two a
        bucket), and the backlog of those due by ``until`` in a second; a bucket whose shard
        fails answers its error. In cluster mode one failing node fails a whole pipeline
        (redis-py), so each shard is peeked apart and at once: one that has not answered in
        ``wait_s`` (real seconds; None: however long it takes) answers PeekPending, and what its
        peek ends with at the next poll."""
        shards = self._shards(buckets)
        for gone in self._shard_peeks.keys() - shards.keys():  # failed over: serves no bucket
            del self._shard_peeks[gone]  # (kept, it would leak, or answer stale if it came back)
        if len(shards) <= 1:
            return self._peek(buckets, until)
        out: dict[int, Peek | Exception] = {}
        asked: dict[str, Future[dict[int, Peek | Exception]]] = {}
        for node, group in shards.items():
            earlier = self._shard_peeks.get(node)
            if earlier is not None and not earlier.done():
                out.update(dict.fromkeys(group, PeekPending(node)))
                continue
            if earlier is not None:  # ended after its poll: its answer, a poll late (a shard
                del self._shard_peeks[node]  # always slower than the wait is still dispatched)
                out.update(earlier.result())
                continue
            asked[node] = self._peek_pool().submit(self._peek_or_errors, group, until)
        wait(asked.values(), timeout=wait_s)
        for node, future in asked.items():
            if future.done():
                out.update(future.result())
            else:
                self._shard_peeks[node] = future
                out.update(dict.fromkeys(shards[node], PeekPending(node)))
        return out

    def _shards(self, buckets: Sequence[int]) -> dict[str, list[int]]:
        """The buckets by the node serving them (one group for a plain Redis)."""
        node_of = getattr(self.client, "get_node_from_key", None)
        if node_of is None:
            return {"": list(buckets)}
        shards: dict[str, list[int]] = defaultdict(list)
        for b in buckets:
            try:
                shards[node_of(keys.due(b)).name].append(b)
            except Exception:  # the slot's owner is not known yet: peeked with the unknown
                shards[""].append(b)
        return shards

    def _peek_pool(self) -> ThreadPoolExecutor:
        if self._shard_pool is None:
            self._shard_pool = ThreadPoolExecutor(8, thread_name_prefix="peek")
        return self._shard_pool

    def _peek_or_errors(self, buckets: Sequence[int], until: int) -> dict[int, Peek | Exception]:
        try:
            return self._peek(buckets, until)
        except Exception as exc:  # the shard's node is down or failing over
            return dict.fromkeys(buckets, exc)

    def _peek(self, buckets: Sequence[int], until: int) -> dict[int, Peek | Exception]:
        pipe = self.client.pipeline(transaction=False)
        for b in buckets:
            due, data = self._keys(b)
            pipe.execute_command(
                "ZRANGEBYSCORE", due, "-inf", f"({NOTED}", "WITHSCORES", "LIMIT", 0, 1
            )
            pipe.execute_command("HMGET", data, keys.SENTINEL, keys.RAN, keys.COLD)
        got = pipe.execute(raise_on_error=False)
        out: dict[int, Peek | Exception] = {}
        ready: list[int] = []  # due by ``until``: their backlog is counted
        for i, bucket in enumerate(buckets):
            first, fields = got[2 * i], got[2 * i + 1]
            if isinstance(first, Exception) or isinstance(fields, Exception):
                out[bucket] = first if isinstance(first, Exception) else fields
                continue
            pair = first[0] if first and isinstance(first[0], list | tuple) else first  # RESP3
            head = _score(pair[1]) if pair else None
            sentinel, ran, cold = fields
            out[bucket] = Peek(head, 0, sentinel and as_text(sentinel), _int(ran), _int(cold))
            if head is not None and head <= until:
                ready.append(bucket)
        if ready:
            pipe = self.client.pipeline(transaction=False)
            for b in ready:
                pipe.execute_command("ZCOUNT", keys.due(b), "-inf", until)
            for bucket, count in zip(ready, pipe.execute(raise_on_error=False), strict=True):
                peek = out[bucket]
                if isinstance(count, Exception):
                    out[bucket] = count
                elif isinstance(peek, Peek):
                    out[bucket] = peek._replace(backlog=int(count))
        return out

    def start_run(
        self, bucket: int, slot: int, token: str, ttl_ms: int, promise: int | None = None
    ) -> bool:
        """Mark the slot, if free (no marker, or its run only finishing), for a run that must
        beat by ``promise`` (see RUN_BEAT_MS)."""
        value = token if promise is None else f"{token}@{promise}"
        return self._marker("start", bucket, slot, value, ttl_ms)

    def touch_run(
        self, bucket: int, slot: int, token: str, ttl_ms: int, promise: int | None = None
    ) -> bool:
        beat = "" if promise is None else promise
        return self._marker("token", bucket, slot, token, ttl_ms, beat)

    def finishing_run(self, bucket: int, slot: int, token: str, ttl_ms: int) -> bool:
        """The slot's run leases no more (a new run may take the slot) and is finishing."""
        return self._marker("token", bucket, slot, token, ttl_ms, "~")

    def run_promise(self, bucket: int, slot: int) -> int | None:
        """By when the slot's run promised its next beat (None: free, or no promise)."""
        held = self.client.get(keys.run(bucket, slot))
        promise = None if held is None else as_text(held).partition("@")[2]
        return int(promise) if promise else None

    def runs(self, slots: Collection[tuple[int, int]]) -> dict[tuple[int, int], str | None]:
        """Each (bucket, slot)'s marker: ``token`` (queued), ``token@promise`` (leasing),
        ``token~`` (finishing) or None (no run), in one round trip; a slot whose shard did not
        answer is left out (unknown)."""
        if not slots:
            return {}
        ordered = list(slots)
        pipe = self.client.pipeline(transaction=False)
        for bucket, slot in ordered:
            pipe.execute_command("GET", keys.run(bucket, slot))
        got = pipe.execute(raise_on_error=False)
        return {
            s: None if v is None else as_text(v)
            for s, v in zip(ordered, got, strict=True)
            if not isinstance(v, Exception)
        }

    def end_run(self, bucket: int, slot: int, token: str) -> bool:
        return self._marker("token", bucket, slot, token, "")

    def _marker(self, script: str, bucket: int, slot: int, *args: Any) -> bool:
        """A run marker's script (lua/start.lua, lua/token.lua): whether it was applied."""
        return bool(self._eval(script, [([keys.run(bucket, slot)], list(args))])[0])

    # ---------------------------------------------------------------- the bucket's own fields

    def field(self, bucket: int, name: str) -> str | None:
        got = self.client.hget(keys.data(bucket), name)
        return None if got is None else as_text(got)

    def set_field(self, bucket: int, name: str, value: str | int) -> None:
        self.client.hset(keys.data(bucket), name, str(value))

    def swap_field(self, bucket: int, name: str, expected: str | None, new: str) -> bool:
        """Set the field to ``new`` only if it holds ``expected`` (None: absent)."""
        call = ([keys.data(bucket)], [name, expected or "", new])
        return bool(self._eval("swap", [call])[0])

    # ---------------------------------------------------------------- inspection

    def cards(self, bucket: int) -> dict[str, tuple[int, Card]]:
        """member -> (score, card) of the bucket, for tests and operators."""
        scored = self.client.pipeline(transaction=False)
        scored.execute_command("ZRANGE", keys.due(bucket), 0, -1, "WITHSCORES")
        scored.execute_command("HGETALL", keys.data(bucket))
        pairs, data = scored.execute()
        texts = {
            as_text(k): as_text(v)
            for k, v in (
                data.items() if isinstance(data, dict) else zip(data[::2], data[1::2], strict=True)
            )
        }
        flat = (
            pairs
            if pairs and not isinstance(pairs[0], list | tuple)
            else [x for p in pairs for x in p]
        )
        return {
            as_text(m): (int(float(s)), Card.decode(as_text(m), texts[as_text(m)]))
            for m, s in zip(flat[::2], flat[1::2], strict=True)
            if as_text(m) in texts
        }

    # ---------------------------------------------------------------- plumbing

    def _per_bucket(self, script: str, rows: Iterable[tuple[int, list[Any]]]) -> list[Any]:
        grouped: dict[int, list[Any]] = defaultdict(list)
        for partition, args in rows:
            grouped[self.bucket_of(partition)].append(args)
        calls = [
            (self._keys(b), [a for args in group[i : i + CHUNK] for a in args])
            for b, group in grouped.items()
            for i in range(0, len(group), CHUNK)
        ]
        return self._eval(script, calls)

    def _eval(self, name: str, calls: Sequence[Call], raise_on_error: bool = True) -> list[Any]:
        """Every call in one round trip (EVALSHA, pipelined); a call that meets NOSCRIPT (a new
        or failed-over node) is made again through the registered script, which loads it."""
        script = self._scripts[name]
        if len(calls) == 1 and raise_on_error:
            return [script.run(keys=calls[0][0], args=calls[0][1])]
        pipe = self.client.pipeline(transaction=False)
        for call_keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(call_keys), *call_keys, *args)
        results: list[Any] = pipe.execute(raise_on_error=False)
        for i, result in enumerate(results):
            if isinstance(result, NoScriptError):
                try:
                    results[i] = script.run(keys=calls[i][0], args=calls[i][1])
                except Exception as exc:
                    results[i] = exc
        errors = [r for r in results if isinstance(r, Exception)]
        if errors and raise_on_error:
            raise errors[0]
        return results


def _int(value: Any) -> int | None:
    return None if value is None else int(as_text(value))


def _score(value: Any) -> int | None:
    score = math.ceil(float(as_text(value)))  # a fraction (a windowed card): from the next ms
    return None if score < 0 else score
