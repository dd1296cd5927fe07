"""The package layout in one place: the layer table, the project's import graph read from the
source, the module size rule, and the layout map of docs/development/layout.md.

`tests/test_layout.py` checks the tree against it; `make layers` prints the graph
(`python -m tools.layout`), and `python -m tools.layout --markdown` writes the docs page that
a test holds equal to it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "exporter")
DOC = Path("docs/development/layout.md")

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

# A module's size is a prompt, not a rule: over REVIEW_LINES it is flagged for a review asking
# whether it has a second reason to change; only well above, at MAX_LINES, is it refused.
REVIEW_LINES = 400
MAX_LINES = 600


def modules(root: Path = REPO_ROOT) -> dict[str, Path]:
    """Dotted module name -> source file, for every module under model/ and exporter/."""
    found: dict[str, Path] = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(path: Path, module: str, known: set[str]) -> set[str]:
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


def graph(root: Path = REPO_ROOT) -> dict[str, set[str]]:
    """Every module -> the project modules it imports."""
    found = modules(root)
    known = set(found)
    return {name: imported(path, name, known) for name, path in found.items()}


def layer_of(module: str) -> str | None:
    """The layer a module belongs to: the longest LAYERS key that is a prefix of its name."""
    found = [k for k in LAYERS if module == k or module.startswith(k + ".")]
    return max(found, key=len) if found else None


def below(layer: str) -> set[str]:
    """Every layer `layer` may import from (itself included)."""
    seen = {layer}
    todo = [layer]
    while todo:
        for lower in LAYERS[todo.pop()]:
            if lower not in seen:
                seen.add(lower)
                todo.append(lower)
    return seen


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """'a -> b' for each import of a layer not below the importer's."""
    wrong = []
    for name, deps in sorted(edges.items()):
        layer = layer_of(name)
        if layer is not None:
            allowed = below(layer)
            wrong += [f"{name} -> {d}" for d in sorted(deps) if layer_of(d) not in allowed | {None}]
    return wrong


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def _summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.split(". ")[0].removesuffix(".")


def _folder(package: str) -> str:
    return "`" + package.replace(".", "/") + "/`"


def render_graph(root: Path = REPO_ROOT) -> str:
    """The layer order, then per layer its modules with line counts and project imports."""
    found, edges = modules(root), graph(root)
    lines = ["Layers, lowest first (each may import from itself and the layers it lists):"]
    lines += [f"  {layer:20s} -> {', '.join(low) or '(nothing)'}" for layer, low in LAYERS.items()]
    for layer in LAYERS:
        members = sorted(m for m in found if layer_of(m) == layer)
        used = sorted({layer_of(d) or d for m in members for d in edges[m]} - {layer})
        lines += ["", f"{layer}  (imports from: {', '.join(used) or 'nothing'})"]
        for name in members:
            size = line_count(found[name])
            flag = f"  <- over {REVIEW_LINES} lines: a second reason to change?" if (
                size > REVIEW_LINES
            ) else ""  # fmt: skip
            lines.append(f"  {name} ({size} lines){flag}")
            lines += [f"      imports {dep}" for dep in sorted(edges[name])]
    wrong = upward_imports(edges)
    lines += ["", "Imports against the layer order: " + (", ".join(wrong) if wrong else "none")]
    return "\n".join(lines) + "\n"


def render_markdown(root: Path = REPO_ROOT) -> str:
    """docs/development/layout.md: the layer table and the packages in each layer (not their
    modules, so that adding a module leaves the page as it is)."""
    packages = {name: path for name, path in modules(root).items() if path.name == "__init__.py"}
    out = [
        "# The package layout",
        "",
        "Generated by `python -m tools.layout --markdown` from the layer table in",
        "`tools/layout.py`; `tests/test_layout.py` fails when this page and the table differ.",
        "`make layers` prints the whole graph: every module, its size and what it imports.",
        "",
        "## Layers, lowest first",
        "",
        "A module imports only from its own layer, the layers its layer sits on, and theirs, down",
        "to `model/`; there is no import cycle. The test bed and the daemon stand side by side",
        "(neither imports the other); replay sits on both.",
        "",
        "| layer | sits on | holds |",
        "|---|---|---|",
    ]
    for layer, lower in LAYERS.items():
        sits_on = ", ".join(_folder(name) for name in lower) or "nothing"
        out.append(f"| {_folder(layer)} | {sits_on} | {_summary(packages[layer])} |")
    out += ["", "## Subpackages", ""]
    for layer in LAYERS:
        inner = sorted(p for p in packages if layer_of(p) == layer and p != layer)
        out += [f"- {_folder(p)}: {_summary(packages[p])}" for p in inner]
    out += [
        "",
        "## Beside the packages",
        "",
        "- `bench/`: benchmark entry points at its top, their shared helpers in `bench/lib/`;",
        "  each prints its figures and writes JSON to `bench/results/`.",
        "- `tests/`: mirrors the tree (`tests/exporter/daemon/` tests `exporter/daemon/`);",
        "  `tests/integration/`, `tests/reliability/`, `tests/ecosystem/`, `tests/vllm/` beside.",
        "- `tools/`: commands about the repository itself, this layout among them.",
        "",
        "## Module size",
        "",
        f"A module over {REVIEW_LINES} lines is flagged: the layout test warns and `make layers`",
        "marks it. The flag asks for a review, not a cut: does the module have a second reason to",
        "change (a second job)? If so, split it along that reason; if not, leave it as it is.",
        f"Moving code out only to get under a count is not the aim. Over {MAX_LINES} lines the",
        "test fails.",
        "",
    ]
    return "\n".join(out)


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print the layer graph of model/ and exporter/.")
    parser.add_argument(
        "--markdown", action="store_true", help=f"write the layout map to {DOC} instead"
    )
    args = parser.parse_args(None if argv is None else list(argv))
    if args.markdown:
        (REPO_ROOT / DOC).parent.mkdir(parents=True, exist_ok=True)
        (REPO_ROOT / DOC).write_text(render_markdown())
        print(f"wrote {DOC}")
    else:
        sys.stdout.write(render_graph())


if __name__ == "__main__":
    main()
