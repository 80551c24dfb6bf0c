"""The folders of simbatch/ are layers, and a module imports only from its own layer or the ones below.

docs/concepts.md's architecture section draws them; this test keeps the drawing true. An import made
only for type checking counts too: it says which way the knowledge runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "simbatch"

# Bottom to top. Packages on one floor may import each other (none does in a circle: see below).
FLOORS = (
    ("registry",),
    ("config",),
    ("model",),
    ("memory", "workload", "features"),
    ("schedulers", "hardware"),
    ("inputs", "observe"),
    ("engine", "analysis"),
    ("simulation",),
    ("app",),
)
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level simbatch package) of every ``simbatch.x`` import in the file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "simbatch" and len(parts) > 1:
                out.append((node.lineno, parts[1]))
    return out


def _layer(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if _layer(p) in FLOOR)


def test_every_folder_has_a_floor():
    top = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
           if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert top - {"data"} == set(FLOOR), "a new top-level package or module needs its place in FLOORS"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_up(path):
    mine = FLOOR[_layer(path)]
    upward = [f"line {line}: simbatch.{target} (floor {FLOOR[target]} above {_layer(path)}'s {mine})"
              for line, target in _imports(path) if target in FLOOR and FLOOR[target] > mine]
    assert not upward, upward


def test_packages_on_one_floor_do_not_import_each_other_in_a_circle():
    edges = {(_layer(p), t) for p in MODULES for _, t in _imports(p)
             if t in FLOOR and t != _layer(p) and FLOOR[t] == FLOOR[_layer(p)]}
    assert not {(a, b) for a, b in edges if (b, a) in edges}, edges
