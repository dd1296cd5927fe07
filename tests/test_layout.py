"""The package layout: imports in one direction, documented packages, a wheel that ships all."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGES = ("model", "exporter")


def _modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module under model/ and exporter/."""
    found: dict[str, Path] = {}
    for top in PACKAGES:
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(path: Path, module: str, known: set[str]) -> set[str]:
    """Project modules `module` imports anywhere in its file, TYPE_CHECKING blocks included."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import name` imports pkg.name when that is a module, else pkg itself.
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            if target in known and target != module:
                out.add(target)
                break
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imported(path, name, known) for name, path in modules.items()}


def test_no_import_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    """The graph reader follows `from x import y` and TYPE_CHECKING imports (else the test above
    could pass on a tree with cycles)."""
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\n"
    (tmp_path / "a.py").write_text(guarded)
    (tmp_path / "b.py").write_text("from a import thing\n")
    known = {"a", "b"}
    assert _imported(tmp_path / "a.py", "a", known) == {"b"}
    assert _imported(tmp_path / "b.py", "b", known) == {"a"}


# The layers, lowest first: a module imports only from its own layer or one below it. The test bed
# and the daemon stand side by side (neither imports the other); replay sits on both.
LAYERS: dict[str, tuple[str, ...]] = {
    "model": (),
    "exporter.base": ("model",),
    "exporter.config": ("exporter.base",),
    "exporter.collector": ("exporter.config",),
    "exporter.sizing": ("exporter.collector",),
    "exporter.daemon": ("exporter.sizing",),
    "exporter.testbed": ("exporter.base",),
    "exporter.replay": ("exporter.daemon", "exporter.testbed"),
    "exporter.cli": ("exporter.replay",),
}


def _layer(module: str) -> str | None:
    """The layer a module belongs to: the longest LAYERS key that is a prefix of its name."""
    found = [k for k in LAYERS if module == k or module.startswith(k + ".")]
    return max(found, key=len) if found else None


def _below(layer: str) -> set[str]:
    """Every layer `layer` may import from (itself included)."""
    seen = {layer}
    todo = [layer]
    while todo:
        for lower in LAYERS[todo.pop()]:
            if lower not in seen:
                seen.add(lower)
                todo.append(lower)
    return seen


def test_every_module_sits_in_a_layer() -> None:
    unplaced = [m for m in _modules() if _layer(m) is None and m not in PACKAGES]
    assert not unplaced, unplaced


def test_imports_follow_the_layer_order() -> None:
    wrong = []
    for name, deps in _graph().items():
        layer = _layer(name)
        if layer is None:
            continue
        allowed = _below(layer)
        wrong += [f"{name} -> {d}" for d in deps if _layer(d) not in allowed | {None}]
    assert not wrong, wrong


def test_the_layer_check_sees_an_upward_import() -> None:
    assert "exporter.daemon" not in _below("exporter.sizing")
    assert "exporter.testbed" not in _below("exporter.daemon")
    assert {"exporter.testbed", "exporter.daemon", "model"} <= _below("exporter.replay")


def test_model_never_imports_exporter() -> None:
    for name, deps in _graph().items():
        if name.split(".")[0] == "model":
            assert not [d for d in deps if d.startswith("exporter")], name


def test_every_package_says_what_it_holds() -> None:
    for top in PACKAGES:
        for init in (REPO_ROOT / top).rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc, f"{init.relative_to(REPO_ROOT)} has no docstring"
            assert len(doc.splitlines()[0]) > 20, f"{init.relative_to(REPO_ROOT)}: {doc!r}"


def test_no_module_over_the_size_guide() -> None:
    for path in _modules().values():
        lines = len(path.read_text().splitlines())
        assert lines <= 420, f"{path.relative_to(REPO_ROOT)} has {lines} lines"


@pytest.mark.integration
def test_wheel_ships_every_module(tmp_path: Path) -> None:
    """The wheel holds every tracked .py file under model/ and exporter/ (an explicit package list
    in pyproject.toml would drop subpackages while the editable install hides it)."""
    tracked = subprocess.run(
        ["git", "ls-files", "pyproject.toml", "README.md", *PACKAGES],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    # Built from a copy: a build/ folder left in the checkout would hide missing packages.
    source = tmp_path / "src"
    for name in tracked:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), "."],
        cwd=source,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("vllm_sizer-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = {name for name in zf.namelist() if name.endswith(".py")}
    modules = {p for p in tracked if p.endswith(".py")}
    assert len(modules) > 40
    assert modules <= shipped, sorted(modules - shipped)
