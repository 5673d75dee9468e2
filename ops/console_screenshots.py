"""The screenshots of the tenant console (docs/console.md), from a real browser:
``python -m ops.console_screenshots``.

It starts nothing: it drives headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
as the e2e tests do) against a stack that is already running, given its API and a key::

    make run                                   # in another shell; prints API: and the demo key
    .venv/bin/python -m ops.console_screenshots [--api URL] [--api-key KEY] [--out docs]

``--api``/``--api-key`` default to ``TIMERS_API``/``TIMERS_API_KEY``, else to the running
``make run`` and its demo key (as the ``timers`` command does). It makes a few timers in the
key's tenant - a cron in Berlin, a heartbeat firing every second, a paused one, two one-offs and
a webhook to ``localhost``, which the service refuses to call, so a failed fire shows - signs in
through the form as a person would, types a webhook cron into the create form, waits for its
preview, and writes, in ``--out``:

    console.png          the list page at 1,280 px: create with its preview, timers, failed fires
    console-narrow.png   the same page at 400 px wide
    console-timer.png    the heartbeat's page at 1,280 px: details, actions, lag chart, fires

Each is the whole page. Then it deletes the timers it made (``--keep`` leaves them; the failed
fire's record stays). The pages show every timer of the tenant: use a fresh ``make run``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from timers_client import Client, NotFound
from timers_client.client import ApiConfigError, Config, after, at, cron, every

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WIDE, NARROW = 1280, 400
MAX_HEIGHT = 3200  # a screenshot of the whole page, up to this
TIMEOUT_S = 60.0  # page loads, API calls and the heartbeat's fires on a busy machine
HEARTBEAT_FIRES = 60  # still active (Pause shown) when its page is taken
SHOWN_FIRES = 10  # the timer page is taken once the heartbeat has fired this often
DOCS = Path(__file__).resolve().parent.parent / "docs"  # where docs/console.md finds them


def sample_timers(client: Client) -> dict[str, str]:
    """A tenant with a bit of everything: name -> id."""
    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(days=3)
    made = {
        "daily-report": client.create(
            cron("0 7 * * 1-5", "Europe/Berlin"), name="daily-report", payload={"report": "daily"}
        ),
        "heartbeat": client.create(
            every(1), name="heartbeat", max_fires=HEARTBEAT_FIRES, payload={"ping": True}
        ),
        "trial-ends": client.create(at(soon), name="trial-ends", payload={"account": 42}),
        "retry-payment": client.create(after(900), name="retry-payment"),
        "nightly-sync": client.create(every(3600), name="nightly-sync"),
        # Resolves to a loopback address: refused at send time, a failed fire at once.
        "order-shipped-hook": client.create(
            after(1),
            name="order-shipped-hook",
            target={"url": "https://localhost/hooks/order-shipped"},
            payload={"order": 1001},
        ),
    }
    client.pause(made["nightly-sync"].id)
    return {name: timer.id for name, timer in made.items()}


@contextmanager
def chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        sys.exit("needs chromium and chromium-driver (Debian: apt-get install them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    with tempfile.TemporaryDirectory(prefix="console-shots-") as profile:
        for flag in (
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--hide-scrollbars", f"--window-size={WIDE},1000",
            f"--user-data-dir={profile}",
        ):  # fmt: skip
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def wait_for(driver: Any, condition: Callable[[Any], Any], timeout_s: float = TIMEOUT_S) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    waiting = WebDriverWait(driver, timeout_s, ignored_exceptions=[StaleElementReferenceException])
    return waiting.until(condition)


def count(driver: Any, css: str) -> int:
    found: int = driver.execute_script("return document.querySelectorAll(arguments[0]).length", css)
    return found


def whole_page(driver: Any, width: int, path: Path) -> None:
    """A screenshot of the whole page laid out ``width`` px wide (a viewport that tall)."""
    metrics = {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    time.sleep(0.3)  # the layout at that width
    height = driver.execute_script("return document.documentElement.scrollHeight")
    metrics["height"] = min(int(height), MAX_HEIGHT)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    time.sleep(0.3)
    driver.execute_script("window.scrollTo(0, 0)")
    driver.save_screenshot(str(path))
    print(f"wrote {path} ({width}x{metrics['height']})")


def take(console: str, key: str, made: dict[str, str], out: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select

    with chromium() as driver:

        def by_id(element_id: str) -> Any:
            return driver.find_element(By.ID, element_id)

        def type_into(element_id: str, text: str) -> None:
            by_id(element_id).clear()
            by_id(element_id).send_keys(text)

        driver.get(console)
        wait_for(driver, ec.visibility_of_element_located((By.ID, "api-key"))).send_keys(key)
        driver.find_element(By.CSS_SELECTOR, "#sign-in-form button[type=submit]").click()
        wait_for(driver, lambda d: all(count(d, f"#timers-table tr[data-id='{timer_id}']")
                                       for timer_id in made.values()))  # fmt: skip
        # The webhook's failed fire, in the panel (shown again until it is there).
        failed = f".failed-group[data-timer='{made['order-shipped-hook']}'] tbody tr"
        deadline = time.monotonic() + TIMEOUT_S
        while not count(driver, failed):
            if time.monotonic() > deadline:
                sys.exit("no failed fire in the console: is the delivery function running?")
            time.sleep(1)
            by_id("failed-filter").find_element(By.CSS_SELECTOR, "button").click()
        # A webhook on a cron, typed in and previewed in its time zone (not created).
        Select(by_id("kind")).select_by_value("cron")
        type_into("cron-expression", "30 8 * * 1-5")
        type_into("cron-timezone", "Europe/Berlin")
        type_into("timer-name", "standup-reminder")
        Select(by_id("target-kind")).select_by_value("url")
        type_into("target-url", "https://hooks.example.com/standup")
        type_into("payload", '{"channel": "#team"}')
        wait_for(driver, lambda d: count(d, "#preview-times li .zone") == 5)
        by_id("timer-name").click()  # somewhere calm for the focus ring
        whole_page(driver, WIDE, out / "console.png")
        whole_page(driver, NARROW, out / "console-narrow.png")

        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        driver.get(f"{console}#/timers/{made['heartbeat']}")
        wait_for(driver, lambda d: count(d, "#lag-chart svg rect.bar") >= SHOWN_FIRES)
        whole_page(driver, WIDE, out / "console-timer.png")
        by_id("sign-out").click()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.console_screenshots",
        description="Screenshots of the tenant console of a running stack (starts nothing).",
    )
    parser.add_argument("--api", help="base URL ending in /v1 (default: $TIMERS_API or make run)")
    parser.add_argument("--api-key", help="a tenant's key (default: $TIMERS_API_KEY or the demo)")
    parser.add_argument("--out", type=Path, default=DOCS, help="directory (default: docs/)")
    parser.add_argument("--keep", action="store_true", help="leave the sample timers")
    args = parser.parse_args(argv)
    try:
        config: Config | None = Config.from_env()
    except ApiConfigError:
        config = None
    api = (args.api or (config.api if config else "")).rstrip("/")
    if not api:
        parser.error("no API: --api, TIMERS_API, or a running make run")
    key = args.api_key or (config.api_key if config and config.api == api else None)
    if not key:
        parser.error("no key: --api-key, TIMERS_API_KEY, or a running make run's demo key")
    args.out.mkdir(parents=True, exist_ok=True)
    with Client(api, key) as client:
        made = sample_timers(client)
        try:
            take(f"{api}/console", key, made, args.out)
        finally:
            if not args.keep:
                for timer_id in made.values():
                    with suppress(NotFound):  # a one-off that has fired may be gone
                        client.delete(timer_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
