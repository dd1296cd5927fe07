"""docs/reference/cli-help/: `vllm-sizer --help` and every `vllm-sizer COMMAND --help`, from the
argparse parsers themselves, one page per command."""

from __future__ import annotations

import os
from unittest import mock

from exporter.cli.main import build_parser
from tools.docs_gen.config_keys import HEADER

WIDTH = "100"  # argparse wraps to the terminal: fixed, so the pages do not depend on it
FOLDER = "docs/reference/cli-help"


def _block(text: str) -> list[str]:
    return ["```text", text.rstrip(), "```", ""]


def pages() -> dict[str, str]:
    with mock.patch.dict(os.environ, {"COLUMNS": WIDTH}):
        parser, commands = build_parser()
        top = parser.format_help()
        helps = {name: sub.format_help() for name, sub in commands.items()}
    index = [
        HEADER,
        "# Command-line help",
        "",
        "The help of every command, as `--help` prints it. An overview with examples:",
        "[command line](../cli.md).",
        "",
        *_block(top),
        *[f"- [`vllm-sizer {name}`]({name}.md)" for name in helps],
    ]
    out = {f"{FOLDER}/index.md": "\n".join(index) + "\n"}
    for name, text in helps.items():
        page = [HEADER, f"# `vllm-sizer {name}`", "", *_block(text)]
        out[f"{FOLDER}/{name}.md"] = "\n".join(page)
    return out
