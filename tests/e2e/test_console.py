"""The tenant console (``GET /v1/console``) in a real browser, against the local stack: headless
Chromium driven by Selenium (the ``browser`` fixture of conftest.py).

A person's session: sign in with the demo key, create a timer due in a few seconds through the
form (its preview shows when), watch its fire appear with its lag, find another timer by name,
pause, resume and delete it, and see the API's error - message and field - for a bad cron. The
page at 1,280 and 400 px wide: create first, nothing to scroll sideways. And a failed webhook
fire found in the console's failed-fires panel and redelivered from it. A list answer overtaken
by a filter change or a sign-out (held in the page's fetch) is never shown.

The session saves screenshots in ``tmp_path`` (pytest keeps the last runs'), to look at when it
fails; docs/console.md's are taken by ``ops/console_screenshots.py``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from tests.support.local_stack import RunningStack, start_stack
from tests.support.webhook_server import webhook_server

pytestmark = pytest.mark.e2e

UI_TIMEOUT_S = 30  # page loads and API calls on a busy 2-core runner
FIRE_TIMEOUT_S = 60  # due in 3 s; the page polls the fires every 2 s
DUE_IN_S = 3
# What a browser logs, rightly, for the API's own 4xx answers this test provokes: the bad cron.
EXPECTED_LOAD_ERRORS = re.compile(
    r"/v1/(schedule-preview|timers) - Failed to load resource: "
    r"the server responded with a status of 400"
)


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_sign_in_create_watch_the_fire_pause_delete_and_read_an_error(
    local_stack: RunningStack, browser: Any, tmp_path: Path
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    shots = tmp_path
    key = local_stack.ready["Tenant demo API key: "]
    run = uuid4().hex[:6]
    status, beat, _ = local_stack.request(
        "POST",
        "/timers",
        key=key,
        body={"name": f"heartbeat-{run}", "schedule": {"type": "every", "seconds": 1},
              "max_fires": 60, "payload": {"run": run}},
    )  # fmt: skip
    assert status == 201, beat

    browser.set_window_size(1280, 1200)
    wait = WebDriverWait(browser, UI_TIMEOUT_S, ignored_exceptions=[StaleElementReferenceException])

    def by_id(element_id: str) -> Any:
        return browser.find_element(By.ID, element_id)

    def texts(css: str) -> list[str]:  # read in one go: the timer page re-renders as it polls
        found: list[str] = browser.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", css
        )
        return found

    # ---- sign in: the key goes to sessionStorage, never into the URL
    assert local_stack.console == f"{local_stack.api}/console"  # the line make run prints
    browser.get(local_stack.console)
    sign_in(browser, wait, key)
    assert key not in browser.current_url
    assert browser.execute_script("return sessionStorage.getItem('timers.apiKey')") == key
    wait.until(lambda d: f"heartbeat-{run}" in texts("#timers-table tbody td"))

    # ---- the preview follows the form as it is typed: a recurring schedule's next five...
    Select(by_id("kind")).select_by_value("every")
    by_id("every-seconds").clear()
    by_id("every-seconds").send_keys("90")
    wait.until(lambda d: len(texts("#preview-times time")) == 5)
    previewed = [_parse(t) for t in texts("#preview-times time")]
    assert {(b - a).total_seconds() for a, b in pairwise(previewed)} == {90}
    browser.save_screenshot(str(shots / "console.png"))

    # ---- ...then a timer created through the form, after 3 s, its preview showing when
    Select(by_id("kind")).select_by_value("after")
    by_id("after-seconds").clear()
    by_id("after-seconds").send_keys(str(DUE_IN_S))
    by_id("timer-name").send_keys(f"soon-{run}")
    by_id("payload").send_keys('{"from": "console"}')
    typed_at = datetime.now(UTC)

    def previews_the_due_time(_: Any) -> bool:
        times = texts("#preview-times time")
        return len(times) == 1 and 0 < (_parse(times[0]) - typed_at).total_seconds() <= 10

    wait.until(previews_the_due_time)
    # The failed-fires panel shows (on an API without those routes, a 404 would hide it).
    settled = wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute(
        "data-failed-fires"))  # fmt: skip
    assert (settled, by_id("failed-panel").is_displayed()) == ("available", True)
    by_id("create-button").click()
    wait.until(lambda d: d.current_url.split("#", 1)[-1].startswith("/timers/tmr"))
    created_id = browser.current_url.split("#/timers/", 1)[1]
    wait.until(ec.text_to_be_present_in_element((By.ID, "timer-id"), created_id))
    status, timer, _ = local_stack.request("GET", f"/timers/{created_id}", key=key)
    assert (status, timer["name"], timer["payload"]) == (200, f"soon-{run}", {"from": "console"})

    # ---- its fire appears in the history, with its lag, and in the chart
    WebDriverWait(browser, FIRE_TIMEOUT_S).until(
        lambda d: [t for t in texts("#fires-table tbody td.lag") if t.isdigit()]
    )
    [shown_lag] = texts("#fires-table tbody td.lag")
    status, fires, _ = local_stack.request("GET", f"/timers/{created_id}/fires", key=key)
    [fire] = fires["items"]
    assert int(shown_lag) == fire["lag_ms"] >= 0  # never early
    assert texts("#fires-table tbody code") == [fire["fire_id"]]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#lag-chart svg rect.bar")) == 1
    assert f"{fire['lag_ms']} ms" in by_id("lag-summary").text

    # ---- back to the list; find the heartbeat by name (client-side search) and open it
    browser.find_element(By.CSS_SELECTOR, "#timer-view a[href='#/']").click()
    wait.until(ec.visibility_of_element_located((By.ID, "name-search"))).send_keys(f"beat-{run}")
    wait.until(lambda d: texts("#timers-table tbody tr td:first-child") == [beat["id"]])
    browser.find_element(By.LINK_TEXT, beat["id"]).click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "timer-id"), beat["id"]))
    WebDriverWait(browser, FIRE_TIMEOUT_S).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#lag-chart svg rect.bar")) >= 4
    )
    browser.save_screenshot(str(shots / "console-timer.png"))

    # ---- pause, resume, then delete behind a confirmation
    by_id("pause-button").click()
    wait.until(lambda d: texts("#timer-details dd[data-field=status]") == ["paused"])
    assert local_stack.request("GET", f"/timers/{beat['id']}", key=key)[1]["status"] == "paused"
    assert by_id("resume-button").is_displayed() and not by_id("pause-button").is_displayed()
    by_id("resume-button").click()
    wait.until(lambda d: texts("#timer-details dd[data-field=status]") == ["active"])
    assert local_stack.request("GET", f"/timers/{beat['id']}", key=key)[1]["status"] == "active"
    by_id("delete-button").click()
    dialog = wait.until(ec.visibility_of_element_located((By.ID, "confirm-dialog")))
    assert beat["id"] in dialog.text
    by_id("confirm-ok").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), f"Deleted {beat['id']}"))
    assert browser.current_url.endswith("#/")
    assert local_stack.request("GET", f"/timers/{beat['id']}", key=key)[0] == 404

    # ---- an API error is shown as the contract's message and each field's
    bad = {"schedule": {"type": "cron", "expression": "61 * * * *", "timezone": "UTC"}}
    status, answer, _ = local_stack.request("POST", "/timers", key=key, body=bad)
    assert status == 400
    [detail] = answer["error"]["details"]
    Select(by_id("kind")).select_by_value("cron")
    by_id("cron-expression").clear()
    by_id("cron-expression").send_keys("61 * * * *")
    by_id("create-button").click()
    wait.until(ec.visibility_of_element_located((By.ID, "create-error")))
    # The message names the field and why (a 400's details are in it: not listed twice).
    assert by_id("create-error").text.splitlines() == [answer["error"]["message"]]
    assert f"{detail['field']}: {detail['message']}" in answer["error"]["message"]
    assert detail["field"] == "schedule.expression"
    wait.until(ec.text_to_be_present_in_element((By.ID, "preview-error"), "schedule.expression"))

    # ---- sign out forgets the key
    by_id("sign-out").click()
    wait.until(ec.visibility_of_element_located((By.ID, "api-key")))
    assert browser.execute_script("return sessionStorage.getItem('timers.apiKey')") is None

    unexpected = [
        e for e in browser.get_log("browser")
        if e["level"] == "SEVERE" and not EXPECTED_LOAD_ERRORS.search(e["message"])
    ]  # fmt: skip
    assert unexpected == []  # no script error, no CSP violation, nothing loaded from elsewhere


def test_cron_times_show_in_their_zone_and_a_paused_timer_has_no_next_fire(
    local_stack: RunningStack, browser: Any
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    key = local_stack.ready["Tenant demo API key: "]
    run = uuid4().hex[:6]
    berlin = {"type": "cron", "expression": "0 7 * * *", "timezone": "Europe/Berlin"}
    made = {}
    for name, schedule in (("berlin", berlin), ("resting", {"type": "every", "seconds": 60})):
        status, made[name], _ = local_stack.request(
            "POST", "/timers", key=key, body={"name": f"{name}-{run}", "schedule": schedule}
        )
        assert status == 201, made[name]
    local_stack.request("POST", f"/timers/{made['resting']['id']}/pause", key=key)
    wait = WebDriverWait(browser, UI_TIMEOUT_S, ignored_exceptions=[StaleElementReferenceException])

    def row(name: str) -> list[str]:
        cells: list[str] = browser.execute_script(
            "const css = `#timers-table tr[data-id='${arguments[0]}'] td`;"
            "return [...document.querySelectorAll(css)].map(e => e.textContent)",
            made[name]["id"],
        )
        return cells

    browser.get(local_stack.console)
    wait.until(ec.visibility_of_element_located((By.ID, "api-key"))).send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#sign-in-form button[type=submit]").click()
    wait.until(lambda d: row("berlin") and row("resting"))
    next_fire = made["berlin"]["next_fire_at"]  # 07:00 in Berlin is 05:00 or 06:00 UTC
    assert row("berlin")[-1].startswith(next_fire) and " 07:00 Europe/Berlin)" in row("berlin")[-1]
    assert row("resting")[-1] == "— (paused)"

    browser.find_element(By.LINK_TEXT, made["berlin"]["id"]).click()
    shown = (By.CSS_SELECTOR, "#timer-details dd[data-field=next-fire]")
    wait.until(ec.text_to_be_present_in_element(shown, "07:00 Europe/Berlin"))
    browser.find_element(By.CSS_SELECTOR, "#timer-view a[href='#/']").click()

    Select(wait.until(ec.visibility_of_element_located((By.ID, "kind")))).select_by_value("cron")
    browser.find_element(By.ID, "cron-expression").clear()
    browser.find_element(By.ID, "cron-expression").send_keys("30 8 * * *")
    browser.find_element(By.ID, "cron-timezone").clear()
    browser.find_element(By.ID, "cron-timezone").send_keys("Asia/Tokyo")
    wait.until(lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, "#preview-times li")
                          if " 08:30 Asia/Tokyo" in e.text])  # fmt: skip
    for timer in made.values():
        local_stack.request("DELETE", f"/timers/{timer['id']}", key=key)
    browser.find_element(By.ID, "sign-out").click()


# Read in the page: what a person at that width would have to scroll sideways to reach.
LAYOUT_SCRIPT = """
const view = document.getElementById(arguments[0]);
const width = window.innerWidth;
const visible = (e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== "hidden";
const controls = [...view.querySelectorAll("a, button, input, select, textarea, .table-scroll")]
  .filter(visible)
  .filter((e) => !e.parentElement.closest(".table-scroll"));  // a table's own box scrolls
const out = (e) => {
  const r = e.getBoundingClientRect();
  return r.left < 0 || r.right > width + 0.5;
};
const outside = controls.filter(out)
  .map((e) => `${e.tagName} #${e.id} .${e.className}: ${e.textContent.trim().slice(0, 40)}`);
const unlabelled = [...view.querySelectorAll("input, select, textarea")]
  .filter((e) => !e.labels.length && !e.getAttribute("aria-label")).map((e) => e.id);
const nameless = [...view.querySelectorAll("button")]
  .filter((e) => !(e.getAttribute("aria-label") || e.textContent).trim()).map((e) => e.outerHTML);
return {
  width, height: window.innerHeight, scrollWidth: document.documentElement.scrollWidth,
  outside, unlabelled, nameless, controls: controls.length,
};
"""


def test_the_console_fits_1280_and_400_px_wide_with_create_first(
    local_stack: RunningStack, browser: Any
) -> None:
    """Issue 30: at a desktop's 1,280 px and a phone's 400 px, nothing makes the page scroll
    sideways - a table that does not fit reflows (the timers) or scrolls in its own box (the
    fires) - every control is in reach, and the create form comes first, in view at the top.
    Every input has a label, every button a name, and the keyboard's focus shows."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    key = local_stack.ready["Tenant demo API key: "]
    run = uuid4().hex[:6]
    bodies = {
        # Long words and values: a name, a webhook URL and a cron zone that do not wrap easily.
        "wide": {"name": "QuarterlyReconciliationOfEveryLedger" * 3 + run,
                 "schedule": {"type": "cron", "expression": "15 6 1 */3 *",
                              "timezone": "America/Argentina/Buenos_Aires"},
                 "target": {"url": f"https://hooks.example.com/{'very-long-path-' * 6}{run}"},
                 "payload": {"ledger": "x" * 120}},
        "fired": {"name": f"fired-{run}", "schedule": {"type": "after", "seconds": 1}},
    }  # fmt: skip
    made = {}
    for name, body in bodies.items():
        status, made[name], _ = local_stack.request("POST", "/timers", key=key, body=body)
        assert status == 201, made[name]
    _until(lambda: _fires(local_stack, key, made["fired"]["id"]))
    wait = WebDriverWait(browser, UI_TIMEOUT_S, ignored_exceptions=[StaleElementReferenceException])

    def layout(view: str) -> dict[str, Any]:
        found: dict[str, Any] = browser.execute_script(LAYOUT_SCRIPT, view)
        return found

    def position(element_id: str) -> dict[str, float]:
        rect: dict[str, float] = browser.execute_script(
            "return document.getElementById(arguments[0]).getBoundingClientRect().toJSON()",
            element_id,
        )
        return rect

    rows = [f"#timers-table tr[data-id='{t['id']}']" for t in made.values()]
    browser.set_window_size(1280, 900)
    browser.get(local_stack.console)
    wait.until(ec.visibility_of_element_located((By.ID, "api-key"))).send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#sign-in-form button[type=submit]").click()
    try:
        for width in (1280, 400):
            browser.set_window_size(width, 900)
            browser.get(f"{local_stack.console}#/")
            wait.until(lambda d: all(d.find_elements(By.CSS_SELECTOR, row) for row in rows))
            wait.until(lambda d: d.find_element(By.ID, "failed-panel").is_displayed())
            shown = layout("list-view")
            assert shown["width"] == width
            assert shown["scrollWidth"] <= width, shown  # no sideways scroll
            assert (shown["outside"], shown["unlabelled"], shown["nameless"]) == ([], [], [])
            assert shown["controls"] >= 14  # the fields and buttons of the three cards
            # Create first, then the timers, then the failed fires: in the page and on screen.
            order: list[bool] = browser.execute_script(
                "const [a, b, c] = [...arguments].map((id) => document.getElementById(id));"
                "const follows = (x, y) => x.compareDocumentPosition(y) & 4;"  # 4: FOLLOWING
                "return [!!follows(a, b), !!follows(b, c)]",
                "create-card", "timers-card", "failed-panel",
            )  # fmt: skip
            assert order == [True, True]
            create, timers = position("create-card"), position("timers-card")
            assert create["bottom"] <= timers["top"]
            assert browser.find_element(By.ID, "create-form").is_displayed()
            assert 0 <= create["top"] < 200 and browser.find_element(By.ID, "kind").is_displayed()
            assert position("kind")["bottom"] <= shown["height"]  # in view as the page opens
            # The timers list reflows at 400 px: no table wider than its box.
            box: list[int] = browser.execute_script(
                "const box = document.getElementById('timers-table').parentElement;"
                "return [box.scrollWidth, box.clientWidth]"
            )
            assert box[0] <= box[1], box

            # The keyboard's focus is drawn.
            browser.find_element(By.ID, "timer-name").click()
            browser.switch_to.active_element.send_keys(Keys.TAB)
            focused: dict[str, str] = browser.execute_script(
                "const e = document.activeElement, s = getComputedStyle(e);"
                "return {id: e.id, style: s.outlineStyle, width: s.outlineWidth}"
            )
            assert focused == {"id": "max-fires", "style": "solid", "width": "3px"}

            # A timer's page: long values wrap, its fires scroll in their own box.
            for timer in made.values():
                browser.get(f"{local_stack.console}#/timers/{timer['id']}")
                wait.until(ec.text_to_be_present_in_element((By.ID, "timer-id"), timer["id"]))
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#timer-details dd"))
                if timer is made["fired"]:
                    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#fires-table tbody tr"))
                shown = layout("timer-view")
                assert shown["scrollWidth"] <= width, (timer["id"], shown)
                assert (shown["outside"], shown["unlabelled"], shown["nameless"]) == ([], [], [])
            browser.find_element(By.ID, "delete-button").click()  # the dialog fits too
            dialog = wait.until(ec.visibility_of_element_located((By.ID, "confirm-dialog")))
            assert position("confirm-dialog")["right"] <= width and dialog.is_displayed()
            assert browser.execute_script("return document.documentElement.scrollWidth") <= width
            browser.find_element(By.ID, "confirm-cancel").click()
            wait.until(ec.invisibility_of_element_located((By.ID, "confirm-dialog")))
    finally:
        browser.set_window_size(1280, 2000)
        browser.execute_script("sessionStorage.clear()")
        for timer in made.values():
            local_stack.request("DELETE", f"/timers/{timer['id']}", key=key)


@pytest.fixture(scope="module")
def webhook_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """A stack of its own that lets webhooks reach this test's server on loopback (the shared
    one refuses loopback targets, as a deployment does)."""
    running = start_stack(tmp_path_factory.mktemp("console-webhooks"),
                          TIMERS_ALLOW_LOOPBACK_TARGETS="1")  # fmt: skip
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def _fires(stack: RunningStack, key: str, timer_id: str) -> list[dict[str, Any]]:
    status, page, _ = stack.request("GET", f"/timers/{timer_id}/fires", key=key)
    assert status == 200, page
    items: list[dict[str, Any]] = page["items"]
    return items


def _until(what: Callable[[], Any], timeout_s: float = FIRE_TIMEOUT_S) -> Any:
    """``what()`` once it is truthy; the stack runs on the wall clock, so this polls."""
    deadline = time.monotonic() + timeout_s
    while not (got := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return got


def test_a_failed_webhook_fire_is_found_and_redelivered_from_the_console(
    webhook_stack: RunningStack, browser: Any
) -> None:
    """A webhook answers 400 (the fire fails at once), then is fixed: the console lists the
    failed fire under its timer - the timer's hostile name shown as text - and its Redeliver
    button sends it again, same webhook-id, and it is delivered."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    key = webhook_stack.ready["Tenant demo API key: "]
    hostile = '<img src=x onerror="document.title=1">'
    with webhook_server() as server:
        url = server.on("/console-hook", 400, 200)
        status, timer, _ = webhook_stack.request(
            "POST", "/timers", key=key,
            body={"name": hostile, "schedule": {"type": "after", "seconds": 1},
                  "target": {"url": url}},
        )  # fmt: skip
        assert status == 201, timer
        (fire,) = _until(lambda: [f for f in _fires(webhook_stack, key, timer["id"])
                                  if f["status"] == "failed"])  # fmt: skip
        assert fire["last_status"] == 400

        wait = WebDriverWait(
            browser, UI_TIMEOUT_S, ignored_exceptions=[StaleElementReferenceException]
        )
        # Signed in on the timer's page, its check for failed fires held; the list's own load
        # overtakes it: the fire is listed once when the held answer lands.
        browser.get(f"{webhook_stack.console}#/timers/{timer['id']}")
        browser.execute_script(WATCH_LOADS, r"/v1/fires\?")
        browser.execute_script("window.holding = true")
        sign_in(browser, wait, key)
        wait.until(lambda d: d.execute_script("return window.held.length") == 1)
        browser.execute_script("window.holding = false; location.hash = '#/'")
        group = f".failed-group[data-timer={timer['id']}]"
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"{group} tbody tr"))
        browser.execute_script("window.held.shift()()")
        wait.until(all_handled)
        assert len(browser.find_elements(By.CSS_SELECTOR, f"{group} tbody tr")) == 1

        # The timer's page shows the failed POST's last error: status, latency, the answer.
        browser.get(f"{webhook_stack.console}#/timers/{timer['id']}")
        last = f"#fires-table tr[data-fire='{fire['fire_id']}'] [data-last-error]"
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, last))
        text = browser.find_element(By.CSS_SELECTOR, last).text
        assert text.startswith("last attempt http 400 after ") and text.endswith(" ms: ok"), text
        assert fire["last_error"]["status"] == 400 and fire["last_error"]["body"] == "ok"
        browser.get(webhook_stack.console)  # a fresh load (no fragment): one list render
        panel = wait.until(ec.visibility_of_element_located((By.ID, "failed-panel")))
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"{group} tbody tr"))
        block = panel.find_element(By.CSS_SELECTOR, group)
        assert block.find_element(By.CSS_SELECTOR, ".row span").text == hostile  # as text
        assert panel.find_elements(By.TAG_NAME, "img") == []
        row = block.find_element(By.CSS_SELECTOR, "tbody tr")
        assert row.text.split()[0] == fire["fire_id"] and "400" in row.text.split()

        row.find_element(By.TAG_NAME, "button").click()  # Redeliver
        wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), fire["fire_id"]))
        # A failure no more: it leaves the panel (no Redeliver left to answer 409).
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, f"{group} tbody tr"))
        assert server.wait_for("/console-hook", 2, FIRE_TIMEOUT_S), "not sent again"
        first, again = server.at("/console-hook")
        assert again.headers["webhook-id"] == first.headers["webhook-id"] == fire["fire_id"]
        assert again.body == first.body
        delivered = _until(lambda: [f for f in _fires(webhook_stack, key, timer["id"])
                                    if f["delivered_at"]])  # fmt: skip
        assert (delivered[0]["fire_id"], delivered[0]["status"]) == (fire["fire_id"], "delivered")

        # The timer's page shows it delivered, with when.
        browser.get(f"{webhook_stack.console}#/timers/{timer['id']}")
        shown = f"#fires-table tr[data-fire='{fire['fire_id']}']"
        wait.until(lambda d: "delivered" in d.find_element(By.CSS_SELECTOR, shown).text)
        cells = browser.find_element(By.CSS_SELECTOR, shown).find_elements(By.TAG_NAME, "td")
        assert cells[3].text == delivered[0]["delivered_at"]  # the Delivered column
        assert cells[5].text == "delivered" and cells[7].find_elements(By.TAG_NAME, "button") == []

        failed_query = "/fires?status=failed&since=2020-01-01T00:00:00Z"
        status, listed, _ = webhook_stack.request("GET", failed_query, key=key)
        assert [f for f in listed["items"] if f["fire_id"] == fire["fire_id"]] == []
        status, everything, _ = webhook_stack.request(
            "GET", failed_query + "&include_redelivered=true", key=key
        )
        (record,) = [f for f in everything["items"] if f["fire_id"] == fire["fire_id"]]
        assert record["redelivered_at"] is not None
        assert key not in browser.current_url
    browser.execute_script("sessionStorage.clear()")


def test_edit_reset_run_now_keys_and_usage_from_the_console(
    local_stack: RunningStack, browser: Any
) -> None:
    """A timer edited (name, payload, retry), reset and run from its page; a key created - its
    secret shown once, and it works - and revoked; the month's usage read."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    key = local_stack.ready["Tenant demo API key: "]
    run = uuid4().hex[:6]
    status, timer, _ = local_stack.request(
        "POST", "/timers", key=key,
        body={"name": f"edit-{run}", "schedule": {"type": "every", "seconds": 3600},
              "payload": {"v": 1}},
    )  # fmt: skip
    assert status == 201, timer
    wait = WebDriverWait(browser, UI_TIMEOUT_S, ignored_exceptions=[StaleElementReferenceException])

    def by_id(element_id: str) -> Any:
        return browser.find_element(By.ID, element_id)

    def get(path: str, with_key: str = key) -> Any:
        status, body, _ = local_stack.request("GET", path, key=with_key)
        assert status == 200, body
        return body

    browser.get(local_stack.console)
    sign_in(browser, wait, key)
    browser.get(f"{local_stack.console}#/timers/{timer['id']}")
    wait.until(ec.text_to_be_present_in_element((By.ID, "timer-id"), timer["id"]))

    # ---- edit: only what changed is sent
    name_shown = "#timer-details dd[data-field=name]"
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, name_shown), f"edit-{run}"))
    browser.find_element(By.CSS_SELECTOR, "#edit-details summary").click()
    wait.until(lambda d: by_id("edit-name").get_attribute("value") == f"edit-{run}")
    by_id("edit-name").clear()
    by_id("edit-name").send_keys(f"renamed-{run}")
    by_id("edit-payload").clear()
    by_id("edit-payload").send_keys('{"v": 2}')
    assert not by_id("edit-retry-attempts").is_displayed()  # a queue target: no retry policy
    by_id("edit-window").clear()
    by_id("edit-window").send_keys("60")
    by_id("edit-save").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), f"Saved {timer['id']}"))
    saved = get(f"/timers/{timer['id']}")
    assert (saved["name"], saved["payload"]) == (f"renamed-{run}", {"v": 2})
    assert (saved["window_seconds"], saved["retry"]) == (60, None)
    assert saved["schedule"] == timer["schedule"]
    window_shown = "#timer-details dd[data-field=window]"
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, window_shown), "60 s after"))

    # ---- run now: a fire at once, shown in the history; the schedule stays as it was
    by_id("run-button").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), "Fired "))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#fires-table tbody tr[data-fire]"))
    (fired,) = get(f"/timers/{timer['id']}/fires")["items"]
    assert fired["status"] == "enqueued"
    assert get(f"/timers/{timer['id']}")["next_fire_at"] == timer["next_fire_at"]

    # ---- reset: restarted from now
    by_id("reset-button").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), f"Reset {timer['id']}"))
    reset = get(f"/timers/{timer['id']}")
    assert _parse(reset["next_fire_at"]) > _parse(timer["next_fire_at"])
    assert (reset["status"], reset["fire_count"]) == ("active", 0)

    # ---- keys: create (its secret shown once, and it works), then revoke it
    browser.get(f"{local_stack.console}#/keys")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr"))
    by_id("key-label").send_keys(f"console-{run}")
    by_id("key-create").click()
    wait.until(lambda d: by_id("new-key-secret").text.startswith("tk_"))
    secret = by_id("new-key-secret").text
    assert get("/tenant", with_key=secret)["tenant"] == "demo"
    row = f"#keys-table tr[data-key='{secret[:10]}']"
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row))
    assert f"console-{run}" in browser.find_element(By.CSS_SELECTOR, row).text
    browser.find_element(By.CSS_SELECTOR, f"{row} button").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), f"Revoked {secret[:10]}"))
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, row))
    assert secret[:10] not in [k["key_id"] for k in get("/tenant/keys")["items"]]

    # ---- usage: this month's counts, and a malformed month's error
    browser.get(f"{local_stack.console}#/usage")
    created = "#usage-details dd[data-field=timers-created]"
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, created))
    assert int(browser.find_element(By.CSS_SELECTOR, created).text) >= 1
    enqueued = browser.find_element(By.CSS_SELECTOR, "#usage-details dd[data-field=fires-enqueued]")
    assert int(enqueued.text) >= 1  # the run above
    # the fires by lateness: a row per level, earliest first, with its count and share; the
    # levels add up to the fires enqueued (the page shows one answer)
    levels: list[dict[str, str]] = browser.execute_script(
        "return [...document.querySelectorAll('#usage-lag-table tbody tr')].map(r => ({"
        "level: r.dataset.level, fires: r.querySelector('[data-field=fires]').textContent,"
        "share: r.querySelector('[data-field=share]').textContent,"
        "bar: r.querySelectorAll('[data-field=share] svg rect').length}))"
    )
    assert [row["level"] for row in levels] == [
        "ontime", "1-200ms", "200-600ms", "600-1000ms", "1000-2000ms", "over_2000ms"
    ]  # fmt: skip
    assert sum(int(row["fires"]) for row in levels) == int(enqueued.text)
    shares = [float(row["share"].rstrip("%")) for row in levels]
    assert all(row["share"].endswith("%") and row["bar"] == 2 for row in levels), levels
    assert abs(sum(shares) - 100) < 0.5, levels
    browser.set_window_size(400, 900)  # a phone: the levels fit, nothing to scroll sideways
    wide, room = browser.execute_script(
        "const d = document.documentElement; return [d.scrollWidth, d.clientWidth]"
    )
    assert wide <= room, (wide, room)
    browser.set_window_size(1280, 1200)
    by_id("usage-month").send_keys("2026-13")
    browser.find_element(By.CSS_SELECTOR, "#usage-form button").click()
    wait.until(ec.visibility_of_element_located((By.ID, "usage-error")))
    assert "month" in by_id("usage-error").text
    assert not by_id("usage-lag").is_displayed()  # no answer, no levels
    local_stack.request("DELETE", f"/timers/{timer['id']}", key=key)
    browser.execute_script("sessionStorage.clear()")


def test_a_group_filtered_and_paused_then_deleted_behind_a_confirmation(
    local_stack: RunningStack, browser: Any
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    key = local_stack.ready["Tenant demo API key: "]
    group = f"console-{uuid4().hex[:6]}"
    made = []
    for i in range(4):
        body = {"name": f"{group}-{i}", "schedule": {"type": "every", "seconds": 60},
                **({"group": group} if i < 3 else {})}  # fmt: skip
        status, timer, _ = local_stack.request("POST", "/timers", key=key, body=body)
        assert status == 201, timer
        made.append(timer["id"])
    wait = WebDriverWait(browser, UI_TIMEOUT_S, ignored_exceptions=[StaleElementReferenceException])

    def shown_rows() -> list[list[str]]:
        rows: list[list[str]] = browser.execute_script(
            "return [...document.querySelectorAll('#timers-table tbody tr')]"
            ".map(r => [...r.querySelectorAll('td')].map(c => c.textContent))"
        )
        return rows

    def statuses() -> list[Any]:
        got = [local_stack.request("GET", f"/timers/{i}", key=key) for i in made]
        return [body["status"] if code == 200 else code for code, body, _ in got]

    browser.get(f"{local_stack.console}#/")
    if browser.find_elements(By.ID, "api-key") and by_visible(browser, "api-key"):
        browser.find_element(By.ID, "api-key").send_keys(key)
        browser.find_element(By.CSS_SELECTOR, "#sign-in-form button[type=submit]").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "whoami"), "Tenant demo"))
    assert not browser.find_element(By.ID, "group-actions").is_displayed()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#group-names option[value='{group}']"))
    browser.find_element(By.ID, "group-filter").send_keys(group + "\n")
    wait.until(lambda d: sorted(r[1] for r in shown_rows()) == [f"{group}-{i}" for i in range(3)])
    assert {r[2] for r in shown_rows()} == {group}  # the group column

    browser.find_element(By.ID, "group-pause").click()
    dialog = wait.until(ec.visibility_of_element_located((By.ID, "group-dialog")))
    assert f"Pause every timer of group {group}?" in dialog.text
    browser.find_element(By.ID, "group-cancel").click()  # cancelled: nothing changes
    assert statuses() == ["active"] * 4
    browser.find_element(By.ID, "group-pause").click()
    wait.until(ec.visibility_of_element_located((By.ID, "group-ok"))).click()
    wait.until(
        ec.text_to_be_present_in_element((By.ID, "group-progress"), f"Paused 3 timers of {group}.")
    )
    assert statuses() == ["paused"] * 3 + ["active"]
    wait.until(lambda d: {r[4] for r in shown_rows()} == {"paused"})

    browser.find_element(By.ID, "group-delete").click()
    assert "never fire again" in wait.until(
        ec.visibility_of_element_located((By.ID, "group-dialog"))).text  # fmt: skip
    browser.find_element(By.ID, "group-ok").click()
    wait.until(
        ec.text_to_be_present_in_element((By.ID, "group-progress"), f"Deleted 3 timers of {group}.")
    )
    assert statuses() == [404] * 3 + ["active"]
    local_stack.request("DELETE", f"/timers/{made[3]}", key=key)


# The page's fetch, watched for the API paths matching arguments[0]: window.loads counts the
# calls asked and answered - answered once the page has handled the answer (the macrotask after
# its body is read runs after the page's own promise chain) - and while window.holding is set,
# a call waits in window.held until the test lets it go.
WATCH_LOADS = """
const pattern = new RegExp(arguments[0]);
window.realFetch = window.fetch;
window.holding = false;
window.held = [];
window.loads = { asked: 0, handled: 0 };
window.fetch = (input, init) => {
  if (!pattern.test(String(input))) return window.realFetch(input, init);
  window.loads.asked += 1;
  const answer = async () => {
    const response = await window.realFetch(input, init);
    const text = response.text.bind(response);
    response.text = () => text().then((body) => {
      setTimeout(() => { window.loads.handled += 1; }, 0);
      return body;
    });
    return response;
  };
  if (!window.holding) return answer();
  return new Promise((resolve) => window.held.push(() => resolve(answer())));
};
"""


def all_handled(browser: Any) -> bool:
    loads: dict[str, int] = browser.execute_script("return window.loads")
    return loads["asked"] == loads["handled"]


def test_a_list_answer_overtaken_by_a_filter_change_or_a_sign_out_is_not_shown(
    local_stack: RunningStack, browser: Any
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    key = local_stack.ready["Tenant demo API key: "]
    run = uuid4().hex[:6]
    first, second = f"race-a-{run}", f"race-b-{run}"
    made = []

    def create(group: str, i: int) -> None:
        body = {"name": f"{group}-{i}", "group": group,
                "schedule": {"type": "every", "seconds": 60}}  # fmt: skip
        status, timer, _ = local_stack.request("POST", "/timers", key=key, body=body)
        assert status == 201, timer
        made.append(timer["id"])

    create(first, 0)
    create(second, 0)
    create(second, 1)
    wait = WebDriverWait(browser, UI_TIMEOUT_S, ignored_exceptions=[StaleElementReferenceException])

    def shown_names() -> list[str]:
        names: list[str] = browser.execute_script(
            "return [...document.querySelectorAll('#timers-table tbody tr td:nth-child(2)')]"
            ".map(c => c.textContent).sort()"
        )
        return names

    def filter_by(group: str) -> None:
        browser.find_element(By.ID, "group-filter").clear()
        browser.find_element(By.ID, "group-filter").send_keys(group + "\n")

    def hold_a_list() -> None:
        browser.execute_script("window.holding = true")
        browser.find_element(By.ID, "refresh-timers").click()
        wait.until(lambda d: d.execute_script("return window.held.length") == 1)
        browser.execute_script("window.holding = false")

    def let_it_land() -> None:
        browser.execute_script("window.held.shift()()")
        wait.until(all_handled)

    browser.get(f"{local_stack.console}#/")
    browser.refresh()
    if by_visible(browser, "api-key"):
        sign_in(browser, wait, key)
    filter_by(first)
    wait.until(lambda d: shown_names() == [f"{first}-0"])
    browser.execute_script(WATCH_LOADS, r"/v1/timers\?")

    # A refresh of the first group's list is held; the second group's overtakes it.
    hold_a_list()
    filter_by(second)
    wait.until(lambda d: shown_names() == [f"{second}-0", f"{second}-1"])
    let_it_land()
    assert shown_names() == [f"{second}-0", f"{second}-1"]  # not the overtaken page's row too

    # Signed out while a page is on its way, then in again: the list is loaded afresh.
    hold_a_list()
    browser.find_element(By.ID, "sign-out").click()
    let_it_land()
    create(second, 2)
    sign_in(browser, wait, key)
    wait.until(lambda d: shown_names() == [f"{second}-{i}" for i in range(3)])
    for timer_id in made:
        local_stack.request("DELETE", f"/timers/{timer_id}", key=key)
    browser.execute_script("sessionStorage.clear()")


def sign_in(browser: Any, wait: Any, key: str) -> None:
    """Sign in on the shown sign-in form and wait until the page says who is signed in."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    wait.until(ec.visibility_of_element_located((By.ID, "api-key"))).send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#sign-in-form button[type=submit]").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "whoami"), "Tenant demo"))


def by_visible(browser: Any, element_id: str) -> bool:
    from selenium.webdriver.common.by import By

    return bool(browser.find_element(By.ID, element_id).is_displayed())
