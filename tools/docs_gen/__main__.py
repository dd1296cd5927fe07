"""`python -m tools.docs_gen [--check]`: write the generated pages, or check they are current."""

from __future__ import annotations

import argparse
import sys

from tools.docs_gen import ROOT, generate, stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_gen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    pages = generate()
    changed = stale(pages)
    if args.check:
        for path in changed:
            print(f"out of date: {path}")
        return 1 if changed else 0
    for path in changed:
        target = ROOT / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(pages[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
