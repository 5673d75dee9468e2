"""One local stack (``make run``'s, on free ports) shared by the e2e tests that only talk to it
as a client - the fuzzer, the docs page and the console in a browser, the SDK and the CLI. Each
of them makes a tenant of its own, so they never see each other's timers (the console test uses
the demo tenant, as a person would, and names its timers uniquely). The stack tests in
``test_local_stack*.py`` start their own stacks: they stop and break them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.local_stack import RunningStack, start_stack

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_stack(tmp_path_factory.mktemp("shared-stack"))
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium driven by Selenium: Debian's ``chromium`` and ``chromium-driver``
    (``/usr/bin/chromium``, ``/usr/bin/chromedriver``) as installed - Selenium downloads
    nothing. CI (``.ci/run``) installs both and sets ``TIMERS_REQUIRE_BROWSER=1``, so there a
    missing browser fails; elsewhere the test is skipped only when the browser is absent.

    Background networking is off: a page that reached for anything but the API would show a
    failed load in the browser's log, which the tests read (``goog:loggingPrefs``)."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        if os.environ.get("TIMERS_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium and chromium-driver are required here (apt-get install them)")
        pytest.skip("no chromium/chromedriver (Debian: apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-quic", "--no-first-run", "--window-size=1280,2000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
