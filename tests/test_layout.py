"""The package layout: imports in one direction, documented packages, a wheel that ships all."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tools.layout import (
    DOC,
    LAYERS,
    MAX_LINES,
    PACKAGES,
    REVIEW_LINES,
    below,
    graph,
    imported,
    layer_of,
    line_count,
    modules,
    render_markdown,
    upward_imports,
)


class ScopeReview(UserWarning):
    """A module over REVIEW_LINES lines: review it for a second reason to change."""


def test_no_import_cycles() -> None:
    edges = graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    """The graph reader follows `from x import y` and TYPE_CHECKING imports (else the test above
    could pass on a tree with cycles)."""
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\n"
    (tmp_path / "a.py").write_text(guarded)
    (tmp_path / "b.py").write_text("from a import thing\n")
    known = {"a", "b"}
    assert imported(tmp_path / "a.py", "a", known) == {"b"}
    assert imported(tmp_path / "b.py", "b", known) == {"a"}


def test_every_module_sits_in_a_layer() -> None:
    unplaced = [m for m in modules() if layer_of(m) is None and m not in PACKAGES]
    assert not unplaced, unplaced


def test_imports_follow_the_layer_order() -> None:
    wrong = upward_imports(graph())
    assert not wrong, wrong


def test_the_layer_check_sees_an_upward_import() -> None:
    edges = {"exporter.sizing.x": {"exporter.daemon.y", "model.z"}, "exporter.daemon.y": set()}
    assert upward_imports(edges) == ["exporter.sizing.x -> exporter.daemon.y"]
    assert "exporter.daemon" not in below("exporter.sizing")
    assert "exporter.testbed" not in below("exporter.daemon")
    assert {"exporter.testbed", "exporter.daemon", "model"} <= below("exporter.replay")


def test_model_never_imports_exporter() -> None:
    for name, deps in graph().items():
        if name.split(".")[0] == "model":
            assert not [d for d in deps if d.startswith("exporter")], name


def test_every_package_says_what_it_holds() -> None:
    for top in PACKAGES:
        for init in (REPO_ROOT / top).rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc, f"{init.relative_to(REPO_ROOT)} has no docstring"
            assert len(doc.splitlines()[0]) > 20, f"{init.relative_to(REPO_ROOT)}: {doc!r}"


@pytest.mark.filterwarnings(f"default::{__name__}.ScopeReview")
def test_module_sizes_ask_for_a_scope_review() -> None:
    """Over REVIEW_LINES a warning (see docs/development/layout.md); over MAX_LINES a failure."""
    too_long = []
    for path in modules().values():
        lines, where = line_count(path), path.relative_to(REPO_ROOT)
        if lines > MAX_LINES:
            too_long.append(f"{where} has {lines} lines")
        elif lines > REVIEW_LINES:
            warnings.warn(
                f"{where} has {lines} lines: does it have a second reason to change?",
                ScopeReview,
                stacklevel=1,
            )
    assert not too_long, too_long


def test_the_layout_map_is_the_layer_table() -> None:
    page = (REPO_ROOT / DOC).read_text()
    assert page == render_markdown(), f"{DOC} is stale: run `python -m tools.layout --markdown`"
    assert list(LAYERS)[0] == "model" and all(f"`{k.replace('.', '/')}/`" in page for k in LAYERS)


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
