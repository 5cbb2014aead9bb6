"""The package's layers: a module imports only from its own layer or the layers below it (``config`` at the
bottom). Counts imports at any depth, lazy ones inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "marl_cli"
LAYERS: list[tuple[str, ...]] = [
    ("config",),
    ("determinism", "provenance", "rollout", "sandbox", "store"),
    ("envs", "algorithms", "credit", "workflows", "policies", "rollout.backends", "rollout.generation",
     "rollout.growing_cache", "rollout.padding", "rollout.prefix", "rollout.vllm_generator", "rollout.vllm_install"),
    ("rollout.engine", "tracking", "plugins"),
    ("training", "critics", "report", "gpu_check"),
    ("cli", "__main__"),
]
"""Bottom to top; a module belongs to the layer of its longest listed prefix (``rollout.engine`` before
``rollout``, whose data modules, ``rollout.samples``, sit low)."""


def layer_of(module: str) -> int:
    """The layer of ``marl_cli.<module>``; a module no layer names fails the test (a new package picks one)."""
    best = [(len(prefix), i) for i, names in enumerate(LAYERS) for prefix in names
            if module == prefix or module.startswith(prefix + ".")]
    assert best, f"marl_cli.{module} is in no layer: add it to LAYERS"
    return max(best)[1]


def imports(path: Path) -> set[str]:
    """The ``marl_cli`` modules a file imports (absolute imports, as the package writes them)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        out |= {n.removeprefix("marl_cli.") for n in names if n.startswith("marl_cli.")}
    return out


def upward_imports() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if not module:
            continue
        for target in imports(path):
            if layer_of(target) > layer_of(module):
                found.append(f"{module} -> {target}")
    return found


def test_no_module_imports_from_a_layer_above_its_own():
    assert upward_imports() == []


def test_config_imports_nothing_of_marl_outside_config():
    for path in (PACKAGE / "config").rglob("*.py"):
        assert {t for t in imports(path) if not t.startswith("config")} == set(), path
