"""The package's layers: every import of a marl module points down, at the scale of packages, and no import
circles. Reads every import form at any depth (lazy ones inside functions too): ``import marl_cli.x``,
``from marl_cli import x``, ``from marl_cli.x import y`` (``y`` a module or a name in ``x``) and relative imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "marl_cli"
LAYERS: list[tuple[str, ...]] = [
    ("config",),
    ("core", "determinism", "provenance", "sandbox", "store"),
    ("envs",),
    ("algorithms",),
    ("credit", "losses", "workflows"),
    ("policies",),
    ("rollout", "tracking"),
    ("plugins", "critics", "rewards"),
    ("training",),
    ("report", "gpu_check"),
    ("cli", "__main__"),
]
"""Bottom to top, by top-level package (or module, for the package's own files): a package imports only from its
own layer's packages or lower ones."""


def module_of(path: Path, root: Path = PACKAGE) -> str:
    """``marl_cli.<dotted>`` of a file under ``root`` (a package's ``__init__`` is the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(["marl_cli", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_of(path, root): path for path in sorted(root.rglob("*.py"))}


def imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The marl modules a file imports, each form resolved to the module it loads (a name imported from a
    module is that module; a module imported from a package is the module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in out if name in known}


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the marl modules it imports (itself left out)."""
    found = modules(root)
    return {m: imports(path, m, set(found)) - {m} for m, path in found.items()}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "marl_cli"


def layer_of(package: str) -> int:
    """The layer of a top-level package; a package no layer names fails the test (a new package picks one)."""
    for i, names in enumerate(LAYERS):
        if package in names:
            return i
    raise AssertionError(f"marl_cli.{package} is in no layer: add it to LAYERS")


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets
                  if package_of(a) != "marl_cli" and package_of(b) != "marl_cli"
                  and layer_of(package_of(b)) > layer_of(package_of(a)))


def circle(edges: dict[str, set[str]]) -> list[str]:
    """One import circle of ``edges`` (a path that returns to its start), or [] when there is none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return []


def packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The package graph: one package imports another when any of its modules does."""
    out: dict[str, set[str]] = {}
    for a, targets in edges.items():
        out.setdefault(package_of(a), set()).update(package_of(b) for b in targets if package_of(b) != package_of(a))
    return out


def test_no_package_imports_from_a_layer_above_its_own():
    assert upward(graph()) == []


def test_no_import_circles_between_modules_or_packages():
    edges = graph()
    assert circle(edges) == []
    assert circle({a: b - {"marl_cli"} for a, b in packages(edges).items() if a != "marl_cli"}) == []


def test_config_imports_nothing_of_marl_outside_config():
    edges = graph()
    assert {b for a, targets in edges.items() if package_of(a) == "config" for b in targets
            if package_of(b) != "config"} == set()


@pytest.mark.parametrize(("source", "found"), [
    ("import marl_cli.b.m", {"marl_cli.b.m"}),
    ("from marl_cli import b", {"marl_cli.b"}),
    ("from marl_cli.b import m", {"marl_cli.b.m"}),
    ("from marl_cli.b.m import Thing", {"marl_cli.b.m"}),
    ("def f():\n    from marl_cli.b.m import Thing", {"marl_cli.b.m"}),
    ("from ..b import m", {"marl_cli.b.m"}),
    ("from . import n", {"marl_cli.a.n"}),
])
def test_every_import_form_is_read(tmp_path, source, found):
    for name in ("a/__init__", "a/n", "a/m", "b/__init__", "b/m"):
        (tmp_path / f"{name}.py").parent.mkdir(exist_ok=True)
        (tmp_path / f"{name}.py").write_text("")
    (tmp_path / "a" / "m.py").write_text(source)
    assert graph(tmp_path)["marl_cli.a.m"] == found


def test_an_upward_import_and_a_circle_are_found(tmp_path):
    for name, source in (("config/__init__", ""), ("config/x", "from marl_cli.training import y"),
                         ("training/__init__", ""), ("training/y", "import marl_cli.config.x")):
        (tmp_path / f"{name}.py").parent.mkdir(exist_ok=True)
        (tmp_path / f"{name}.py").write_text(source)
    edges = graph(tmp_path)
    assert upward(edges) == ["marl_cli.config.x -> marl_cli.training.y"]
    assert circle(edges) == ["marl_cli.config.x", "marl_cli.training.y", "marl_cli.config.x"]
