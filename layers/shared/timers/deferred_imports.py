"""Packages whose ``__init__`` runs on first use, not when the package is imported (cold starts).

``redis/__init__.py`` does ``from redis import asyncio``, so every ``import redis`` also imported
the asyncio client (redis.asyncio.client, .cluster, ...: ~110 ms of CPU of a cold start, half
of the trigger's imports), which no function uses. :func:`install` puts a finder first on
``sys.meta_path`` that gives each package of :data:`DEFERRED` a module whose ``__init__`` has
not run yet: its submodules import as usual (redis's sync code imports a few small ones), and
the first attribute asked of the package itself - ``redis.asyncio.Redis``, ``from
redis.asyncio import Redis`` - runs its ``__init__`` then (PEP 562 ``__getattr__``), so code
that uses it sees the package it always did.

``timers/__init__.py`` installs it, so it holds for anything that imports ``timers`` before
``redis`` (every function's handler; a process that imported redis before keeps it whole).
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

DEFERRED = frozenset({"redis.asyncio"})


def initialized(name: str) -> bool:
    """Whether module ``name`` is imported with its ``__init__`` run (False while deferred)."""
    module = sys.modules.get(name)
    return module is not None and "__deferred_init__" not in module.__dict__


class _DeferredInit:
    """Creates the package's module as its own loader would; runs its code on first use.
    (A loader and a finder by protocol: importlib.abc would import importlib.resources.)"""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.lock = threading.RLock()

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        loader, lock = self.loader, self.lock

        def run_init() -> None:
            with lock:
                deferred = module.__dict__.pop("__deferred_init__", None)
                if deferred is None:
                    return  # run already (by another thread, or this one: a circular import)
                hook = module.__dict__.pop("__getattr__")
                try:
                    loader.exec_module(module)
                except BaseException:  # interrupted (the api's deadline): run it next time
                    module.__dict__.update(__deferred_init__=deferred, __getattr__=hook)
                    raise

        def __getattr__(name: str) -> Any:  # only for names the module does not have yet
            run_init()
            return module.__dict__[name] if name in module.__dict__ else _missing(module, name)

        module.__dict__["__deferred_init__"] = run_init
        module.__dict__["__getattr__"] = __getattr__


def _missing(module: ModuleType, name: str) -> Any:
    raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")


class _Finder:
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in DEFERRED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not spec.submodule_search_locations:
            return spec
        spec.loader = _DeferredInit(spec.loader)  # type: ignore[assignment]
        return spec


def install() -> None:
    """Defer DEFERRED's ``__init__`` in this process (idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
