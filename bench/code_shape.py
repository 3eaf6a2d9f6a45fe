"""The shape of the training code: lines and files per package, the largest functions, and the run
config's fields per section — the figures of the train/ layering (issue #33).

Prints one JSON line. `--root` reads another checkout (an older commit's, for a before column); the
config sections are read from this checkout's package only when `--root` is this one.

    .venv/bin/python bench/code_shape.py [--root PATH] [--packages train primitives] [--largest 5]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def package_shape(package: Path, largest: int) -> dict[str, Any]:
    """Lines and files of a package, and its `largest` functions by lines (file:name)."""
    files = sorted(package.rglob("*.py"))
    functions: list[tuple[int, str]] = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                functions.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(package)}:{node.name}"))
    functions.sort(reverse=True)
    return {
        "files": len(files),
        "lines": sum(len(path.read_text(encoding="utf-8").splitlines()) for path in files),
        "largest_functions": [{"function": name, "lines": lines} for lines, name in functions[:largest]],
    }


def config_sections() -> dict[str, Any]:
    """This checkout's run-config fields per section, and which kinds of run each belongs to."""
    from agl_bridge.train.config_schema import SECTIONS, GRPOConfig

    return {
        "fields": len(dataclasses.fields(GRPOConfig)),
        "sections": {
            section.__name__: {"fields": len(dataclasses.fields(section)), "runs": list(section.RUNS)}
            for section, _ in SECTIONS
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=HERE, help="the checkout to read (default: this one)")
    parser.add_argument("--packages", nargs="+", default=["train", "primitives"])
    parser.add_argument("--largest", type=int, default=5, help="how many of the largest functions to list")
    args = parser.parse_args()
    root = args.root.resolve()
    shape: dict[str, Any] = {
        "bench": "code_shape",
        "root": str(root),
        "packages": {
            name: package_shape(root / "agl_bridge" / name, args.largest)
            for name in args.packages
            if (root / "agl_bridge" / name).is_dir()
        },
    }
    if root == HERE:
        shape["config"] = config_sections()
    print(json.dumps(shape))


if __name__ == "__main__":
    main()
