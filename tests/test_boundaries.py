"""The package boundary and the import graph, read from the source (every import, including the
ones inside functions): the manifest is the only contract between the packages, and octtrain's
subpackages (and octstage's) depend on each other without cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, name: str) -> set[str]:
    """Every module ``path`` imports, absolute, with ``from pkg import mod`` resolved to
    ``pkg.mod`` when that is a module."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def graph(package: str) -> dict[str, set[str]]:
    mods = modules(package)
    return {
        name: {m for m in imports(path, name) if m in mods} - {name} for name, path in mods.items()
    }


def test_octtrain_imports_only_the_manifest_from_octstage() -> None:
    octstage = set(modules("octstage"))
    for name, path in modules("octtrain").items():
        used = {m for m in imports(path, name) if m in octstage}
        assert used <= {"octstage", "octstage.manifest"}, (name, used)


@pytest.mark.parametrize("forbidden", ["torch", "octtrain", "torch_xla"])
def test_octstage_never_imports_torch_or_octtrain(forbidden: str) -> None:
    for name, path in modules("octstage").items():
        assert not any(m.split(".")[0] == forbidden for m in imports(path, name)), name


def test_only_the_xla_backend_imports_torch_xla() -> None:
    users = {
        name
        for name, path in modules("octtrain").items()
        if any(m.split(".")[0] == "torch_xla" for m in imports(path, name))
    }
    # runtime/xla.py is the backend; the two model modules import torch_xla lazily, only when a
    # tensor is on an XLA device (its flash kernel, its scan, its checkpoint).
    assert users <= {"octtrain.runtime.xla", "octtrain.models.attention", "octtrain.models.vit3d"}


@pytest.mark.parametrize("package", ["octstage", "octtrain"])
def test_no_import_cycle(package: str) -> None:
    """Inside functions too: a lazy import that closes a cycle still hides a tangle."""
    deps = graph(package)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(deps[node]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for module in sorted(deps):
        if module not in state:
            visit(module, [module])
