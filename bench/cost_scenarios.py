"""The cost benchmark's scenarios: each runs the deployment (bench.cost_stack) through one shape
of work and keeps what it added over the idle work of the same minutes and polls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.common import progress
from bench.cost_stack import IdleModel, Stack
from timers.core.times import format_ms
from timers.engine.entries import CHECKPOINT_EVERY

PAYLOAD = {"order": 123456, "action": "remind", "note": "a typical small callback payload"}
BIG_PAYLOAD = {"blob": "x" * (60 * 1024)}  # near the 64 KiB limit
HOUR_MS, DAY_MS = 3_600_000, 86_400_000
CHECKPOINT_WRU = 3  # a checkpoint: the timer item (<= 1 KB), its new listing, the old deleted
RETENTION_DAYS = 30  # FireRetentionDays (template default): a completed timer is kept so long


def at(ms: int, payload: Any = PAYLOAD, **more: Any) -> dict[str, Any]:
    return {"name": "bench", "schedule": {"type": "at", "at": format_ms(ms)}, "payload": payload,
            **more}  # fmt: skip


def every(seconds: int, start_ms: int, payload: Any = PAYLOAD, **more: Any) -> dict[str, Any]:
    return {"name": "bench", "schedule": {"type": "every", "seconds": seconds},
            "start_at": format_ms(start_ms), "payload": payload, **more}  # fmt: skip


def cron(expression: str) -> dict[str, Any]:
    return {"name": "bench", "schedule": {"type": "cron", "expression": expression},
            "payload": PAYLOAD}  # fmt: skip


@dataclass
class Scenario:
    name: str
    description: str
    added: dict[str, float]
    expected_fires: int
    recurring: bool = False
    assume_checkpoints: bool = False  # every CHECKPOINT_EVERY fires: too rare to wait for
    stored_bytes: float = 0.0  # a one-shot's timer item, as DynamoDB bills storage
    stored_days: float = 0.0  # ... kept this long (until due, then the retention)
    ops: int = 0  # priced per operation (a reset, a run now) instead of per fire, if set
    missing: int | None = None  # fires due in the window never received, where counted by id

    @property
    def fires(self) -> int:
        return int(self.added["fires"])

    @property
    def delivered(self) -> bool:
        """Every fire arrived: none missing by id where they were counted, else the count."""
        return self.missing == 0 if self.missing is not None else self.fires == self.expected_fires

    def per_fire(self) -> dict[str, float]:
        """What one fire costs (one operation's, with ``ops``)."""
        per = {k: v / max(1, self.ops or self.fires) for k, v in self.added.items()}
        per["creates"] = 0.0 if self.recurring or self.ops else 1.0  # a one-shot pays its create
        if self.assume_checkpoints:
            per["dynamodb.wru.checkpoint"] = CHECKPOINT_WRU / CHECKPOINT_EVERY
        per["stored_gb_months"] = self.stored_bytes / 1e9 * self.stored_days / (730 / 24)
        return per


def next_minute(stack: Stack, plus_s: int = 0) -> int:
    return (stack.clock() // 60_000 + 1) * 60_000 + plus_s * 1000


def next_hour(stack: Stack) -> int:
    return (stack.clock() // HOUR_MS + 1) * HOUR_MS


Group = Callable[["Stack", int, IdleModel], list["Scenario"]]


RESIDUAL_KEYS = ("redis.commands", "redis.round_trips", "dynamodb.rru", "log.bytes",
                 "lambda.migrator", "xray.traces.migrator")  # fmt: skip


def batch_created(stack: Stack, due: int, n: int) -> tuple[Any, list[str]]:
    """The window from ``n`` one-shots batch-created now, all due at ``due``, until 30 s after
    they fired; and their ids."""
    made: list[str] = []

    def batch() -> None:
        made.extend(stack.create_batch([at(due) for _ in range(n)]))

    return stack.measure((due - stack.clock() + 30_000) / 1000, batch), made


def idle_model(stack: Stack) -> tuple[dict[str, float], IdleModel, dict[str, float]]:
    """Idle work per minute (dense, as deployed), the model subtracted from each window (two
    dense idle minutes and twenty sparse ones, profiled poll by poll), and the model's check:
    what it leaves of thirty more idle sparse minutes (should be ~0)."""
    progress("cost: warming up, then two idle minutes and twenty sparse idle minutes")
    stack.run(60)
    dense = stack.profile_idle(120)
    stack.sparse = True
    stack.profile_idle(20 * 60)
    model = stack.idle_profile.model()
    left = stack.measure(30 * 60).minus(model)
    stack.sparse = False
    per_minute = {k: v / dense.minutes for k, v in dense.counts.items()}
    residual = {k: round(left.get(k, 0), 3) for k in RESIDUAL_KEYS}
    return per_minute, model, residual


def short_scenarios(stack: Stack, burst: int, idle: IdleModel) -> list[Scenario]:
    """Today's five: minutes long, dense polling throughout."""
    out: list[Scenario] = []

    def recurring(name: str, count: int, payload: Any, description: str) -> None:
        start = next_minute(stack, 30)
        stack.run(1)
        ids = stack.create_batch([every(60, start, payload) for _ in range(count)])
        while stack.clock() < start + 1_000:  # the first fires chain the next ones
            stack.run(1)
        window = stack.measure(120)
        out.append(Scenario(name, description, window.minus(idle), 2 * count, recurring=True,
                            assume_checkpoints=True))  # fmt: skip
        stack.delete(ids)
        stack.run(2)

    progress(f"cost: {burst} recurring timers due together (one tenant), two minutes")
    recurring("recurring_batched", burst, PAYLOAD,
              f"{burst} timers every 60 s sharing a start, one tenant (spread 8): ~{burst // 8} "
              "fires per trigger run and claim item; creation excluded")  # fmt: skip
    progress("cost: the same with a 60 KiB payload")
    recurring("recurring_batched_64k", burst, BIG_PAYLOAD,
              "the same with a 60 KiB payload: DynamoDB units must not grow with it")  # fmt: skip

    progress("cost: 30 recurring timers, each alone in its second")
    base = next_minute(stack)
    ids = [stack.create(every(60, base + 60_000 + i * 2_000)) for i in range(30)]
    stack.run(60 + 61)
    window = stack.measure(120)
    out.append(Scenario("recurring_alone", "30 timers every 60 s at distinct seconds",
                        window.minus(idle), 60, recurring=True,
                        assume_checkpoints=True))  # fmt: skip
    stack.delete(ids)

    progress(f"cost: {burst * 4} one-shots made by batch creates, due together")
    due = next_minute(stack, 90)
    n = burst * 4
    window, made = batch_created(stack, due, n)
    out.append(Scenario("one_shot_batch_create", f"{n} one-shots created 100 per request "
                        "(POST /v1/timers:batch), all due in the same second (< 2 min ahead); "
                        "the creates included", window.minus(idle), n,
                        stored_bytes=stack.stored_bytes(made[:50]),
                        stored_days=RETENTION_DAYS))  # fmt: skip

    progress("cost: 40 one-shots created one by one, each firing alone")
    start = stack.clock()
    made = []

    def singles() -> None:
        for i in range(40):  # half via the api's fast path, half (150 s away) via the migrator
            made.append(stack.create(at(start + (30_000 if i % 2 else 150_000) + i * 1_000)))

    window = stack.measure(240, singles)
    out.append(Scenario("one_shot", "40 one-shots created one by one (POST /v1/timers), each "
                        "firing alone in its second, 30 s or 150 s ahead; the creates included",
                        window.minus(idle), 40, stored_bytes=stack.stored_bytes(made),
                        stored_days=RETENTION_DAYS))  # fmt: skip
    return out


def cron_hourly(stack: Stack, burst: int, idle: IdleModel) -> list[Scenario]:
    out: list[Scenario] = []
    stack.sparse = True  # idle stretches skipped, idle polls modelled
    progress(f"cost: {burst} timers on '0 * * * *' (one tenant), two hourly fires (sparse)")
    stack.run(1)
    ids = stack.create_batch([cron("0 * * * *") for _ in range(burst)])
    start = stack.snapshot()  # creation excluded: a recurring fire's cost
    second_fire = next_hour(stack) + HOUR_MS
    stack.run((second_fire + 30_000 - stack.clock()) / 1000)
    out.append(Scenario("cron_hourly_batched", f"{burst} timers on cron '0 * * * *', one "
                        "tenant, measured over two fires each (period > the 120 s look-ahead: "
                        "a checkpoint and a migrator restore per fire, measured); creation "
                        "excluded", stack.window_since(start).minus(idle), 2 * burst,
                        recurring=True))  # fmt: skip
    stack.delete(ids)
    return out


def cron_daily(stack: Stack, burst: int, idle: IdleModel) -> list[Scenario]:
    out: list[Scenario] = []
    stack.sparse = True  # idle stretches skipped, idle polls modelled
    progress("cost: one timer on '0 9 * * *', two daily fires (sparse)")
    stack.run(1)
    ids = [stack.create(cron("0 9 * * *"))]
    start = stack.snapshot()
    day = stack.clock() // DAY_MS * DAY_MS + 9 * HOUR_MS
    first = day if day > stack.clock() + 180_000 else day + DAY_MS
    stack.run((first + DAY_MS + 30_000 - stack.clock()) / 1000)
    out.append(Scenario("cron_daily_alone", "one timer on cron '0 9 * * *', each fire alone "
                        "(the only work of the day: its trigger and sandbox cold), measured over "
                        "two fires; creation excluded", stack.window_since(start).minus(idle), 2,
                        recurring=True))  # fmt: skip
    stack.delete(ids)
    return out


def one_shot_ahead_batch(stack: Stack, burst: int, idle: IdleModel) -> list[Scenario]:
    out: list[Scenario] = []
    stack.sparse = True  # idle stretches skipped, idle polls modelled
    n = burst * 4
    progress(f"cost: {n} one-shots batch-created 1 h ahead, due together (sparse)")
    stack.run(1)
    due = next_minute(stack, 30) + HOUR_MS
    window, made = batch_created(stack, due, n)
    out.append(Scenario("one_shot_ahead_batch", f"{n} one-shots created 100 per request "
                        "(POST /v1/timers:batch) 1 h ahead, all due in the same second: the "
                        "create stores a wakeup listing, the migrator restores them shortly "
                        "before due; the creates included", window.minus(idle), n,
                        stored_bytes=stack.stored_bytes(made[:50]),
                        stored_days=RETENTION_DAYS + 1 / 24))  # fmt: skip
    return out


def one_shot_ahead(stack: Stack, burst: int, idle: IdleModel) -> list[Scenario]:
    out: list[Scenario] = []
    stack.sparse = True  # idle stretches skipped, idle polls modelled
    progress("cost: 40 one-shots created one by one 1 h ahead at 0.2 creates/s (sparse)")
    stack.run(1)
    made = []
    start = stack.snapshot()
    for _ in range(40):
        made.append(stack.create(at(stack.clock() + HOUR_MS + 500)))
        stack.run(5)
    stack.run(HOUR_MS / 1000 + 30)
    out.append(Scenario("one_shot_ahead", "40 one-shots created one by one (POST /v1/timers) "
                        "at 0.2 creates/s, each 1 h ahead and firing alone; the creates "
                        "included (every request traced: X-Ray's 1/s reservoir)",
                        stack.window_since(start).minus(idle), 40,
                        stored_bytes=stack.stored_bytes(made),
                        stored_days=RETENTION_DAYS + 1 / 24))  # fmt: skip
    return out


def webhook(stack: Stack, burst: int, idle: IdleModel) -> list[Scenario]:
    out: list[Scenario] = []
    stack.sparse = True  # idle stretches skipped, idle polls modelled
    progress(f"cost: {burst} webhook timers every 60 s, due together, through delivery")
    url = stack.webhooks.on("/hook", 200)
    begin = next_minute(stack, 30)
    stack.run(1)
    ids = stack.create_batch([every(60, begin, target={"url": url}) for _ in range(burst)])
    stack.sparse = False  # two minutes of fires: dense throughout
    while stack.clock() < begin + 1_000:
        stack.run(1)
    window = stack.measure(120)
    out.append(Scenario("webhook_batched", f"{burst} timers every 60 s with an HTTP target "
                        "(target.url), one tenant, one origin, due together: the trigger puts "
                        "them on the delivery queue, the delivery function (batches of 10) "
                        "POSTs each, takes and releases 2 slots and writes its delivery record; "
                        "creation excluded", window.minus(idle), 2 * burst, recurring=True,
                        assume_checkpoints=True))  # fmt: skip
    stack.delete(ids)
    return out


def controls(stack: Stack, burst: int, idle: IdleModel) -> list[Scenario]:
    """The tenant's controls, priced per operation: a reset, a run now."""
    out: list[Scenario] = []
    resets = burst * 4
    progress(f"cost: a busy session - one timer reset {resets:,} times, then its one fire")
    timer = stack.create({"name": "bench", "schedule": {"type": "after", "seconds": 30},
                          "payload": PAYLOAD})  # fmt: skip
    stack.run(2)
    start = stack.snapshot()
    for _ in range(resets):  # 16 a second: under the tenant's rate limit
        stack.call("POST", f"/v1/timers/{timer}/reset")
        stack.run(0.0625)
    stack.run(35)
    out.append(Scenario("reset", f"one timer 'after 30 s' reset {resets:,} times, 16 a second "
                        "(an inactivity timeout kept alive), then its one fire: per reset",
                        stack.window_since(start).minus(idle), 1, ops=resets))  # fmt: skip
    progress("cost: 40 timers each run now once")
    ids = stack.create_batch([every(3600, stack.clock() + HOUR_MS) for _ in range(40)])
    stack.run(2)
    start = stack.snapshot()
    for timer_id in ids:
        stack.call("POST", f"/v1/timers/{timer_id}/run")
        stack.run(1)
    out.append(Scenario("run_now", "40 timers (every hour, not due) each run now once, one a "
                        "second: the request, its extra fire, its record; per run now",
                        stack.window_since(start).minus(idle), 40, ops=40))  # fmt: skip
    stack.delete([timer, *ids])
    return out


SPREAD_RATES = {"0p1": 0.1, "1": 1.0, "10": 10.0, "100": 100.0}
"""The cost curve's loads: one tenant's fires a second, spread evenly over each second."""
SPREAD_PERIOD_S = 60
SPREAD_WINDOWS_S = (0, 60)


def spread_name(rate: str, window_s: int) -> str:
    return f"spread_{rate}_w{window_s}"


def spread_group(rate_name: str, window_s: int) -> Group:
    """The cost curve at one load and window: ``rate`` fires a second of one tenant, each timer
    every 60 s at its own phase (evenly apart: at 100 fires/s one every 10 ms); two minutes
    (at 100 fires/s one) measured after every timer fired once, creation excluded. A group of
    its own: moto's transactions copy the whole table, so deleting thousands of timers would
    take longer than a fresh deployment."""
    rate = SPREAD_RATES[rate_name]
    name = spread_name(rate_name, window_s)

    def group(stack: Stack, burst: int, idle: IdleModel) -> list[Scenario]:
        count = round(rate * SPREAD_PERIOD_S)
        gap_ms = SPREAD_PERIOD_S * 1000 // count
        progress(f"cost: {name}: {count} timers every {SPREAD_PERIOD_S} s, {gap_ms} ms apart, "
                 f"window {window_s} s")  # fmt: skip
        start = next_minute(stack, 30)
        stack.run(1)
        timers = [every(SPREAD_PERIOD_S, start + i * gap_ms, window_seconds=window_s)
                  for i in range(count)]  # fmt: skip
        ids = stack.create_batch(timers)
        while stack.clock() < start + (SPREAD_PERIOD_S + window_s) * 1000:
            stack.run(1)  # every timer fired once (and chained its next fires)
        periods = 1 if rate >= 100 else 2  # moto is slow: 100 fires/s for one period
        since = stack.clock()
        window = stack.measure(periods * SPREAD_PERIOD_S)
        # A run armed near the window's end goes on past it (its waits move the one clock), so
        # the window may hold more than its periods' fires: each fire due in the span it really
        # covered is looked for by id once the last runs are done.
        until = stack.clock()
        stack.run(window_s + 2)
        missing = sum(f"{timer_id}:{due}" not in stack.received
                      for i, timer_id in enumerate(ids)
                      for due in range(start + i * gap_ms, until, SPREAD_PERIOD_S * 1000)
                      if due >= since)  # fmt: skip
        return [Scenario(name, f"{rate:g} fires/s of one tenant: {count} timers every "
                         f"{SPREAD_PERIOD_S} s, {gap_ms} ms apart, window_seconds {window_s}, "
                         f"{periods * SPREAD_PERIOD_S} s measured; creation excluded",
                         window.minus(idle), periods * count, recurring=True,
                         assume_checkpoints=True, missing=missing)]  # fmt: skip

    group.__name__ = name
    return group


SPREAD_GROUPS = tuple(spread_group(r, w) for r in SPREAD_RATES for w in SPREAD_WINDOWS_S)


GROUPS: tuple[Group, ...] = (
    short_scenarios,
    cron_hourly,
    cron_daily,
    one_shot_ahead_batch,
    one_shot_ahead,
    webhook,
    controls,
    *SPREAD_GROUPS,
)
"""Each group runs on a fresh deployment, after its own idle profile: moto slows down as its
tables grow (DynamoDB does not), and two days of migrator runs over every earlier scenario's
items would take an hour."""
