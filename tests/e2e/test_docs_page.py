"""The docs page (``GET /v1/docs``) in a real browser: headless Chromium, driven by Selenium
(the ``browser`` fixture of conftest.py: Debian's chromium and chromedriver, required in CI).

The page must work offline: Swagger UI's assets come from the API itself, and the browser
runs with background networking off, so a request to anywhere else would show up as a failed
load in its console, which must stay free of errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.local_stack import RunningStack

pytestmark = pytest.mark.e2e

RENDER_TIMEOUT_S = 60


def test_the_docs_page_shows_every_operation_and_calls_the_api(
    local_stack: RunningStack, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    status, doc, _ = local_stack.request("GET", "/openapi.json")
    assert status == 200
    documented = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}

    browser.get(f"{local_stack.api}/docs")
    wait = WebDriverWait(browser, RENDER_TIMEOUT_S)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) == len(documented))
    shown = {
        (
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text.strip(),
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"),
        )
        for block in browser.find_elements(By.CSS_SELECTOR, ".opblock")
    }
    assert shown == documented
    groups = {
        e.get_attribute("data-tag") for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-tag")
    }
    assert groups == {tag["name"] for tag in doc["tags"]}  # by resource; no "default"
    assert "Timer service" in browser.find_element(By.CSS_SELECTOR, ".info .title").text
    browser.save_screenshot(str(tmp_path / "docs.png"))  # for a person: see --basetemp

    # "Try it out" on GET /v1/health: the page really calls the API and shows its answer.
    health = browser.find_element(By.ID, "operations-service-health_v1_health_get")
    health.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    wait.until(lambda d: health.find_elements(By.CSS_SELECTOR, ".try-out__btn"))
    health.find_element(By.CSS_SELECTOR, ".try-out__btn").click()
    wait.until(lambda d: health.find_elements(By.CSS_SELECTOR, ".execute"))
    health.find_element(By.CSS_SELECTOR, ".execute").click()
    wait.until(lambda d: health.find_elements(By.CSS_SELECTOR, ".live-responses-table"))
    answer = health.find_element(By.CSS_SELECTOR, ".live-responses-table .response")
    assert answer.find_element(By.CSS_SELECTOR, ".response-col_status").text.startswith("200")
    assert '"status": "ok"' in answer.find_element(By.CSS_SELECTOR, ".microlight").text

    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
