"""Building blocks of config validation: a reader that walks a YAML tree and collects one
'key.path: problem, got value' line per bad key, and the value checks it applies."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class KeyReader:
    """Walks the YAML tree collecting one 'path: problem' line per bad key."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, message: str, value: Any) -> None:
        self.problems.append(f"{path}: {message}, got {value!r}")

    def mapping(self, node: Any, path: str, allowed: set[str]) -> Mapping[str, Any]:
        if node is None:
            return {}
        if not isinstance(node, Mapping):
            self.fail(path, "must be a mapping", node)
            return {}
        for key in node:
            if key not in allowed:
                self.fail(
                    f"{path}.{key}" if path else str(key),
                    f"unknown key (allowed: {', '.join(sorted(allowed))})",
                    node[key],
                )
        return node

    def get(
        self,
        node: Mapping[str, Any],
        key: str,
        path: str,
        check: Callable[[Any], T | None],
        message: str,
        default: T,
    ) -> T:
        if key not in node or node[key] is None:
            return default
        value = check(node[key])
        if value is None:
            self.fail(join_key(path, key), message, node[key])
            return default
        return value

    def required(
        self,
        node: Mapping[str, Any],
        key: str,
        path: str,
        check: Callable[[Any], T | None],
        message: str,
    ) -> T | None:
        if key not in node or node[key] is None:
            self.problems.append(f"{join_key(path, key)}: is required ({message})")
            return None
        return self.get(node, key, path, check, message, None)


def join_key(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def number(low: float, *, inclusive: bool = False) -> Callable[[Any], float | None]:
    def check(value: Any) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        number = float(value)
        if not math.isfinite(number) or number < low or (number == low and not inclusive):
            return None
        return number

    return check


def integer(low: int) -> Callable[[Any], int | None]:
    def check(value: Any) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return None
        return int(value)

    return check


def string(pattern: re.Pattern[str] | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if not isinstance(value, str) or not value.strip():
            return None
        if pattern is not None and not pattern.fullmatch(value):
            return None
        return value

    return check


def http_url(value: Any) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        return value
    return None


def file_path(value: Any) -> Path | None:
    return Path(value) if isinstance(value, str) and value.strip() else None


def choice(options: tuple[str, ...]) -> Callable[[Any], str | None]:
    return lambda value: value if value in options else None
