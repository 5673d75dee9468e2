"""The shared library's floors (timers/__init__.py): a module imports its own package or a
lower floor, never a higher one, and no two packages import each other; no module under
layers/ is over 500 lines.

Every import counts, wherever it stands: at the top, inside a function (a lazy import is still
a dependency), under ``if TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ROOT / "layers"
TIMERS = LAYERS / "shared" / "timers"

FLOORS = {
    "core": 1,  # the pure rules
    "store": 2,  # DynamoDB access, the timers table, AWS clients
    "tenancy": 3,  # tenants, API keys, usage, rate limits
    "engine": 4,  # the fire path
    "delivery": 5,  # webhook delivery
    "api": 6,  # the HTTP API's use cases and models
    "": 7,  # timers itself: config, runtime (the wiring), deferred_imports
}
"""Each package of ``timers`` and its floor, bottom to top ("": the modules of ``timers``
itself)."""

MAX_LINES = 500


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted
    line: int

    def where(self) -> str:
        return f"{self.module} (line {self.line}) imports {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(TIMERS.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(dotted: str) -> bool:
    base = TIMERS.parent.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> Iterator[Import]:
    """The project modules ``path`` imports, lazy ones included."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from timers.engine import keys`` imports the module timers.engine.keys
            targets = [
                f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target == "timers" or target.startswith("timers."):
                yield Import(module, target, node.lineno)


def package_of(dotted: str) -> str:
    """The package of ``timers`` a module belongs to ("" for timers' own modules)."""
    parts = dotted.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (TIMERS / parts[1] / "__init__.py").is_file()):
        return parts[1]
    return ""


def all_imports() -> list[Import]:
    return [found for path in sorted(TIMERS.rglob("*.py")) for found in imports_of(path)]


def upward(imports: Iterable[Import], floors: Mapping[str, int]) -> list[str]:
    """Each import of a higher floor than the importer's."""
    return [
        f"{found.where()}: floor {floors[package_of(found.target)]} "
        f"({package_of(found.target) or 'timers'}) is above floor "
        f"{floors[package_of(found.module)]} ({package_of(found.module) or 'timers'})"
        for found in imports
        if floors[package_of(found.target)] > floors[package_of(found.module)]
    ]


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The cycles of a graph, each once, as the packages along it (the first repeated last)."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                loop = path[path.index(nxt) :]
                if frozenset(loop) not in seen:
                    seen.add(frozenset(loop))
                    found.append([*loop, nxt])
            else:
                walk(nxt, [*path, nxt])

    for start in sorted(edges):
        walk(start, [start])
    return found


def package_edges(imports: Iterable[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for found in imports:
        source, target = package_of(found.module), package_of(found.target)
        if source != target:
            edges.setdefault(source or "timers", set()).add(target or "timers")
    return edges


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


# ---------------------------------------------------------------- the rules


def test_every_package_has_a_floor() -> None:
    packages = {p.parent.name for p in TIMERS.glob("*/__init__.py")}
    assert packages - FLOORS.keys() == set(), "a new package needs its floor in FLOORS"


def test_no_module_imports_a_higher_floor() -> None:
    offences = upward(all_imports(), FLOORS)
    assert not offences, "imports of a higher floor:\n" + "\n".join(offences)


def test_no_import_cycle_between_packages() -> None:
    loops = [" -> ".join(loop) for loop in cycles(package_edges(all_imports()))]
    assert not loops, "packages importing each other:\n" + "\n".join(loops)


def test_no_module_under_layers_is_over_500_lines() -> None:
    over = [
        f"{p.relative_to(ROOT)}: {lines(p)} lines"
        for p in sorted(LAYERS.rglob("*.py"))
        if lines(p) > MAX_LINES
    ]
    assert not over, f"modules over {MAX_LINES} lines:\n" + "\n".join(over)


def test_the_trigger_is_at_most_450_lines() -> None:
    trigger = TIMERS / "engine" / "trigger.py"
    assert lines(trigger) <= 450, f"engine/trigger.py is {lines(trigger)} lines"


ENGINE_TARGET_LINES = 3_000
"""The engine's size target, with the window and groups: missed. The package is 4,008 lines
(the trigger split in four, callbacks.py joined it); what would close the gap is in
docs/how-it-works.md ("Code layout"). Until then the engine may not grow: ENGINE_MAX_LINES."""
ENGINE_MAX_LINES = 3_957


def test_the_engine_does_not_grow() -> None:
    total = sum(lines(p) for p in (TIMERS / "engine").rglob("*.py"))
    assert total <= ENGINE_MAX_LINES, (
        f"the engine package is {total} lines: over today's {ENGINE_MAX_LINES} (its target is "
        f"{ENGINE_TARGET_LINES}); fold or move something out before adding to it"
    )


# ---------------------------------------------------------------- the checks catch breaches


def test_an_upward_import_is_named() -> None:
    lazy = Import("timers.core.timer", "timers.engine.keys", 7)
    assert upward([lazy, Import("timers.api.views", "timers.engine.entries", 3)], FLOORS) == [
        "timers.core.timer (line 7) imports timers.engine.keys: floor 4 (engine) is above "
        "floor 1 (core)"
    ]


def test_a_cycle_between_packages_is_found() -> None:
    edges = {"api": {"delivery", "core"}, "delivery": {"engine"}, "engine": {"api"}}
    assert cycles(edges) == [["api", "delivery", "engine", "api"]]
    assert cycles({"api": {"core"}, "delivery": {"core"}}) == []


def test_lazy_imports_are_read() -> None:
    found = {(i.module, i.target) for i in imports_of(TIMERS / "runtime.py")}
    assert ("timers.runtime", "timers.engine.trigger") in found  # imported inside a function
    assert ("timers.runtime", "timers.store.aws") in found  # ``from timers.store import aws``
