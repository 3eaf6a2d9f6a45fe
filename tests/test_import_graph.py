"""The import graph of `agl_bridge`: no cycle between modules or parts, and parts import only what the layering allows.

Every import counts — at module level, inside functions (lazy imports), and under
`if TYPE_CHECKING:` — because each is a dependency a reader has to follow. The allowed edges
between parts (`agl_bridge.<part>`) are `MAY_IMPORT` below, the table docs/architecture.md
("Dependencies point one way") describes; change both together.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agl_bridge"
ROOT = "agl_bridge"

# Every part may import these: they import no other part (types only semconv).
FOUNDATION = frozenset({"_version", "semconv", "types", "export_files", "errors", "quick_exit", "agent_keys"})

MAY_IMPORT: dict[str, frozenset[str]] = {
    "_env": frozenset(),
    "_version": frozenset(),
    "semconv": frozenset(),
    "export_files": frozenset(),
    "errors": frozenset(),
    "quick_exit": frozenset(),
    "agent_keys": frozenset(),
    "types": frozenset({"semconv"}),
    "models": FOUNDATION,
    "store": FOUNDATION,
    "chat": FOUNDATION,
    "sampler": FOUNDATION | {"models"},
    "tracing": FOUNDATION | {"store"},
    "convert": FOUNDATION | {"store"},
    "runner": FOUNDATION | {"store", "tracing"},
    "proxy": FOUNDATION | {"chat", "sampler", "store", "tracing"},
    "export": FOUNDATION | {"convert", "store"},
    # the Tinker-shaped primitives: a training client publishing to a sampler; no proxy, runner, converter or store.
    "primitives": FOUNDATION | {"models", "sampler"},
    # the Tinker API server: the SDK's wire protocol over the primitives and in-process samplers.
    "tinker_api": FOUNDATION | {"models", "primitives", "sampler"},
    # train drives the runner and an in-process proxy, converts what they recorded and trains on it.
    "train": FOUNDATION | {"chat", "convert", "models", "primitives", "proxy", "runner", "sampler", "store"},
    # the harness of the reliability tests and benchmarks: proxies in subprocesses, load, fuzzing.
    "testing": FOUNDATION | {"chat", "models", "proxy", "runner", "sampler", "store"},
    "sampling_demo": FOUNDATION | {"chat", "models", "sampler"},
    "__main__": frozenset({"cli"}),  # `python -m agl_bridge` is the CLI
    # the read-only web app over a store and a run dir; only the CLI imports it.
    "viewer": FOUNDATION | {"chat", "convert", "models", "store", "train"},
    "cli": FOUNDATION
    | {
        "chat",
        "convert",
        "export",
        "models",
        "primitives",
        "proxy",
        "runner",
        "sampler",
        "sampling_demo",
        "store",
        "tinker_api",
        "tracing",
        "train",
        "viewer",
    },
    ROOT: frozenset({"_env", "_version", "tracing"}),  # `agl_bridge.emit_reward` is tracing's, imported on use
}

# Module cycles still allowed, each as the set of modules in it: none.
ALLOWED_MODULE_CYCLES: list[frozenset[str]] = []


def modules(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Every module of the package by dotted name, with its file and whether it is a package `__init__`."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imports_of(name: str, path: Path, is_package: bool, known: Iterable[str]) -> set[str]:
    """The package's modules `name` imports anywhere in its source (`from x import submodule` names the submodule)."""
    known = set(known)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in known else target)
    return {target for target in found if target in known and target != name}


def module_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports."""
    found = modules(package)
    return {name: imports_of(name, path, is_package, found) for name, (path, is_package) in found.items()}


def part_of(module: str) -> str:
    """The part a module belongs to: `agl_bridge.<part>...` → `<part>`; the package root is `agl_bridge`."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else ROOT


def part_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """Part → the other parts its modules import."""
    parts: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = parts.setdefault(part_of(module), set())
        edges.update(part_of(target) for target in targets if part_of(target) != part_of(module))
    return parts


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graphs here are a few hundred nodes deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_path_through(graph, component) for component in components]


def _path_through(graph: Mapping[str, Iterable[str]], component: set[str]) -> list[str]:
    """A cycle inside a strongly connected component, found by walking it until a node repeats."""
    path = [min(component)]
    while True:
        step = min(target for target in graph[path[-1]] if target in component)
        if step in path:
            return [*path[path.index(step) :], step]
        path.append(step)


def test_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = module_graph()
    assert "agl_bridge.store.sqlite" in graph["agl_bridge.store"]  # module level, package __init__
    assert "agl_bridge.tracing.rewards" in graph[ROOT]  # inside a function
    assert "agl_bridge.semconv" in graph["agl_bridge.types"]  # `from agl_bridge import semconv`
    assert "agl_bridge.convert.export" in graph["agl_bridge.export"]


def test_modules_import_each_other_without_cycles() -> None:
    found = [cycle for cycle in cycles(module_graph()) if frozenset(cycle) not in ALLOWED_MODULE_CYCLES]
    assert not found, "import cycles between modules:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_parts_import_each_other_without_cycles() -> None:
    found = cycles(part_graph(module_graph()))
    assert not found, "import cycles between parts:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_the_allowed_layering_itself_points_one_way() -> None:
    assert cycles({part: set(allowed) for part, allowed in MAY_IMPORT.items()}) == []


def test_parts_import_only_what_the_layering_allows() -> None:
    graph = module_graph()
    unplaced = sorted({part_of(module) for module in graph} - set(MAY_IMPORT))
    assert not unplaced, (
        f"parts missing from MAY_IMPORT (place them in the layering, and in docs/architecture.md): {unplaced}"
    )
    forbidden = sorted(
        f"{module} imports {target} ({part_of(module)} -> {part_of(target)})"
        for module, targets in graph.items()
        for target in targets
        if part_of(target) != part_of(module) and part_of(target) not in MAY_IMPORT[part_of(module)]
    )
    assert not forbidden, "imports against the layering (docs/architecture.md):\n" + "\n".join(forbidden)


def test_pure_primitives_and_the_viewers_advantages_load_without_torch() -> None:
    code = (
        "import sys, agl_bridge.primitives, agl_bridge.primitives.advantages, agl_bridge.train.advantages; "
        "print(sorted(m for m in ('torch', 'peft', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"importing pure modules loaded {result.stdout.strip()}"
