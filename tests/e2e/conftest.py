"""One local stack (``make run``'s, on free ports) shared by the e2e tests that only talk to it
as a client - the fuzzer, the docs page in a browser, the SDK and the CLI. Each of them makes a
tenant of its own, so they never see each other's timers. (The stack tests in
``test_local_stack*.py`` start their own stacks: they stop and break them.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.local_stack import RunningStack, start_stack


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_stack(tmp_path_factory.mktemp("shared-stack"))
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()
