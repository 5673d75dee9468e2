"""What a running local stack tells other commands (``make tenant``): its ports and demo key.

The stack writes ``$LOCAL_STATE_DIR/stack.json`` (default ``.local/``) once it is ready and
removes it when it stops; API keys are stored hashed, so this file is the only way to read the
demo key back.

One stack at a time owns a state directory: it holds ``stack.lock`` (an flock, let go by the
kernel however the stack ends) from before it touches anything there, so a second ``make run``
that fails can never remove or overwrite the running stack's files. ``children.json`` lists
the processes the stack started outside its own process group (redis-server, moto, DynamoDB
Local): after a ``kill -9`` of the stack they outlive it, and the next start names them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import IO, Any

from ops.template import ROOT


def state_dir() -> Path:
    return Path(os.environ.get("LOCAL_STATE_DIR") or ROOT / ".local")


def state_file() -> Path:
    return state_dir() / "stack.json"


def children_file() -> Path:
    return state_dir() / "children.json"


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2))
    tmp.chmod(0o600)  # stack.json holds an API key
    tmp.replace(path)


def write(state: dict[str, Any]) -> None:
    _write_json(state_file(), state)


def read() -> dict[str, Any] | None:
    """The running stack's state; None if no stack is running (a stale file is ignored)."""
    try:
        state: dict[str, Any] = json.loads(state_file().read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def remove() -> None:
    """Only the holder of the lock calls this: the files are its own."""
    state_file().unlink(missing_ok=True)
    children_file().unlink(missing_ok=True)


class StateDirBusy(Exception):
    """Another stack holds the state directory; the message names it."""


class Lock:
    """The state directory's lock, held for the stack's life."""

    def __init__(self) -> None:
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        path = state_dir() / "stack.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            running = read()
            who = f" (pid {running['pid']}, API {running['api_url']})" if running else ""
            raise StateDirBusy(
                f"a local stack is already running from {state_dir()}{who}: stop it first, "
                "or give this one its own LOCAL_STATE_DIR and ports"
            ) from None
        self._file = handle

    @property
    def held(self) -> bool:
        return self._file is not None

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing lets the flock go
            self._file = None


def record_children(stack_pid: int, children: dict[int, str]) -> None:
    """The processes the stack started that would outlive a ``kill -9`` of it: pid -> what."""
    _write_json(
        children_file(),
        {"stack_pid": stack_pid, "children": {str(p): w for p, w in children.items()}},
    )


def leftovers() -> dict[int, str]:
    """Processes a killed stack left running (its recorded children still alive, the same
    programs - a reused pid runs something else), by pid; empty if its stack still runs."""
    try:
        record = json.loads(children_file().read_text())
        stack_pid, children = int(record["stack_pid"]), record["children"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if _alive(stack_pid):
        return {}
    alive = {int(pid): what for pid, what in children.items() if _runs(int(pid), what)}
    return dict(sorted(alive.items()))  # by pid: the same line whatever order they started in


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _runs(pid: int, what: str) -> bool:
    """Whether ``pid`` is alive and its command line names ``what``'s program."""
    with contextlib.suppress(OSError):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        program = what.split()[0]
        return program in cmdline
    return False
