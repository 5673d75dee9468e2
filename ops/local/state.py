"""What a running local stack tells other commands (``make tenant``): its ports and demo key.

The stack writes ``$LOCAL_STATE_DIR/stack.json`` (default ``.local/``) once it is ready and
removes it when it stops; API keys are stored hashed, so this file is the only way to read the
demo key back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ops.template import ROOT


def state_dir() -> Path:
    return Path(os.environ.get("LOCAL_STATE_DIR") or ROOT / ".local")


def state_file() -> Path:
    return state_dir() / "stack.json"


def write(state: dict[str, Any]) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.chmod(0o600)  # it holds an API key
    tmp.replace(path)


def read() -> dict[str, Any] | None:
    """The running stack's state; None if no stack is running (a stale file is ignored)."""
    try:
        state: dict[str, Any] = json.loads(state_file().read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def remove() -> None:
    state_file().unlink(missing_ok=True)
