"""A figure of the bench results: a JSON file of bench/results/ and a key path in it, printed
in a fixed format; and the inline figures of the docs pages.

`/` separates keys, a number indexes a list, `[k=v,...]` picks the list item whose fields
match, and a trailing `|min` or `|max` reduces a list. Inline, a figure is marked with its file,
key path and format, and the generator rewrites the text between the markers:
`<!--fig closed_loop.json scenarios/itl-bound/table/queueing/any_over/mean f1-->2.0<!--/fig-->`
(the key path may hold spaces; the file is the first word, the format the last).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
FORMATS = {
    "pct0": lambda v: f"{100 * v:.0f}",
    "pct1": lambda v: f"{100 * v:.1f}",
    "pct2": lambda v: f"{100 * v:.2f}",
    "f0": lambda v: f"{v:.0f}",
    "f1": lambda v: f"{v:.1f}",
    "f2": lambda v: f"{v:.2f}",
    "f3": lambda v: f"{v:.3f}",
    "e3": lambda v: f"{v:.3e}",
    "int": lambda v: f"{int(v)}",
}


@dataclass(frozen=True)
class Figure:
    """One number: where it is (file, key path) and how it is printed."""

    file: str
    path: str
    fmt: str

    def value(self) -> Any:
        node: Any = json.loads((RESULTS / self.file).read_text())
        path, _, reduce = self.path.partition("|")
        for part in path.split("/"):
            pick = re.fullmatch(r"\[(.*)\]", part)
            if isinstance(node, list) and part.isdigit():
                node = node[int(part)]
            elif pick:
                wanted = dict(kv.split("=") for kv in pick.group(1).split(","))
                node = next(
                    item for item in node if all(str(item[k]) == v for k, v in wanted.items())
                )
            else:
                node = node[part]
        if reduce:
            return min(node) if reduce == "min" else max(node)
        return node

    def text(self) -> str:
        return FORMATS[self.fmt](self.value())


INLINE = re.compile(r"<!--fig (\S+) ([^>]+?) ([a-z0-9]+)-->(.*?)<!--/fig-->", re.S)


def inline(text: str) -> str:
    """`text` with every inline figure rewritten from its JSON."""

    def value(match: re.Match[str]) -> str:
        file, path, fmt = match.group(1), match.group(2), match.group(3)
        shown = Figure(file, path, fmt).text()
        return f"<!--fig {file} {path} {fmt}-->{shown}<!--/fig-->"

    return INLINE.sub(value, text)
