"""Building blocks of config validation: reading the file as bounded YAML, a reader that walks
the tree and collects one 'key.path: problem, got value' line per bad key, the value checks it
applies, and host name resolution."""

from __future__ import annotations

import math
import re
import reprlib
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from exporter.base.errors import ConfigError
from exporter.config.values import DEFAULT_LISTEN_HOST

T = TypeVar("T")

MAX_CONFIG_BYTES = 1 << 20  # a real configuration is a few KiB
# Nodes of the document once every alias is expanded: a "billion laughs" file is small on disk
# and only explodes when its aliases are followed. A real configuration has a few hundred.
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64  # a real configuration nests 5 levels deep
SHOWN_CHARS = 80  # of a value quoted in an error message
# Problems listed by one ConfigError; beyond them, a count: a file of a thousand bad keys must
# not print a thousand lines.
MAX_PROBLEMS_SHOWN = 20
TOP_LEVEL = "(top level)"  # the path of the document itself in a problem line

# A value in a message is quoted at most this deep and wide, then cut to SHOWN_CHARS: a 1 MB
# string or a structure with a million elements makes a short message, and quickly.
_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2
_SHORT.maxdict = _SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = 4
_SHORT.maxstring = _SHORT.maxother = SHOWN_CHARS
_SHORT.maxlong = 40


class UnusableConfigError(ConfigError):
    """A configuration the daemon cannot start with at all: the file is unreadable, too large,
    not UTF-8 or not YAML, or a host in it does not exist. Shown on one line, so that `run`
    prints a single 'vllm-sizer: ...' line."""

    def __str__(self) -> str:
        return "; ".join(self.problems)


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` cut to `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(value: Any) -> str:
    """A bounded repr of `value` for an error message."""
    return shorten(_SHORT.repr(value))


@dataclass(frozen=True, slots=True)
class KeyRule:
    """One key as the reader checks it: where it is, what it must be, its default."""

    path: str  # e.g. deployments[0].slo.ttft_ms
    rule: str  # the message a bad value gets
    default: Any  # None: not set
    required: bool


class KeyReader:
    """Walks the YAML tree collecting one 'path: problem' line per bad key. It also records each
    key it checks (`rules`) and each section's allowed keys (`sections`): the table of keys,
    rules and defaults the reference documentation is generated from."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.rules: dict[str, KeyRule] = {}
        self.sections: dict[str, frozenset[str]] = {}

    def note(
        self, path: str, key: str, rule: str, default: Any = None, *, required: bool = False
    ) -> None:
        """Record the rule of a key, for keys checked without `get` or `required`."""
        where = join_key(path, key)
        self.rules.setdefault(where, KeyRule(where, rule, default, required))

    def error(self) -> ConfigError:
        """The ConfigError to raise: the first MAX_PROBLEMS_SHOWN problems and a count of the
        rest."""
        shown = self.problems[:MAX_PROBLEMS_SHOWN]
        if len(self.problems) > MAX_PROBLEMS_SHOWN:
            shown.append(f"(document): {len(self.problems) - MAX_PROBLEMS_SHOWN} more problems")
        return ConfigError(shown)

    def fail(self, path: str, message: str, value: Any) -> None:
        self.problems.append(f"{path or TOP_LEVEL}: {message}, got {describe(value)}")

    def mapping(self, node: Any, path: str, allowed: set[str]) -> Mapping[str, Any]:
        self.sections.setdefault(path, frozenset(allowed))
        if node is None:
            return {}
        if not isinstance(node, Mapping):
            self.fail(path, "must be a mapping", node)
            return {}
        for key in node:
            if key not in allowed:
                self.fail(
                    join_key(path, shorten(str(key))),
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
        self.note(path, key, message, default)
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
        self.note(path, key, message, required=True)
        if key not in node or node[key] is None:
            self.problems.append(f"{join_key(path, key)}: is required ({message})")
            return None
        return self.get(node, key, path, check, message, None)


def join_key(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def number(
    low: float, high: float = math.inf, *, inclusive: bool = False
) -> Callable[[Any], float | None]:
    """A finite number in (low, high], or [low, high] when `inclusive`."""

    def check(value: Any) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            return None
        if not math.isfinite(number) or number < low or (number == low and not inclusive):
            return None
        return number if number <= high else None

    return check


def integer(low: int, high: int | None = None) -> Callable[[Any], int | None]:
    """An integer in [low, high] (no upper bound when `high` is None)."""

    def check(value: Any) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return None
        return int(value) if high is None or value <= high else None

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
    if not isinstance(value, str) or not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        return None
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises ValueError for a port that is not 0-65535
    except ValueError:
        return None
    return value if parts.hostname else None


def listen_address(value: Any) -> tuple[str, int] | None:
    """HOST:PORT (an empty host or [::]-style brackets allowed) as (host, port)."""
    if not isinstance(value, str):
        return None
    host, sep, port = value.rpartition(":")
    # ASCII digits only, and few: int() refuses '²' and strings of thousands of digits.
    if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    if not 0 < int(port) < 65536:
        return None
    return host.strip("[]") or DEFAULT_LISTEN_HOST, int(port)


def file_path(value: Any) -> Path | None:
    # A NUL byte makes every later open() of the path raise ValueError, not OSError.
    ok = isinstance(value, str) and bool(value.strip()) and "\x00" not in value
    return Path(value) if ok else None


def choice(options: tuple[str, ...]) -> Callable[[Any], str | None]:
    return lambda value: value if value in options else None


# getaddrinfo errors that mean the name does not exist; any other failure (EAI_AGAIN: the DNS
# server did not answer) may pass, so it is left to the cycles, which retry and count it.
_NO_SUCH_HOST = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def address_problems(listen_host: str, listen_port: int, prometheus_url: str | None) -> list[str]:
    """One 'key: problem' per address of the configuration whose host does not exist."""
    problems = [
        f"listen_address: {problem}"
        for problem in [_unresolvable(listen_host, listen_port, passive=True)]
        if problem is not None
    ]
    if prometheus_url is not None:
        url = urlsplit(prometheus_url)
        problem = _unresolvable(url.hostname or "", url.port or 80, passive=False)
        if problem is not None:
            problems.append(f"prometheus.url: {problem}")
    return problems


def _unresolvable(host: str, port: int, *, passive: bool) -> str | None:
    """Why `host` can never be listened on (`passive`) or reached, or None when it resolves or
    the failure may be temporary."""
    try:
        socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE if passive else 0
        )
    except socket.gaierror as exc:
        if exc.errno in _NO_SUCH_HOST:
            return f"host {describe(host)} does not resolve ({exc.strerror})"
    except UnicodeError:  # a label too long for IDNA
        return f"host {describe(host)} is not a valid host name"
    return None


def read_yaml(path: Path) -> Any:
    """The document of a YAML file, read within the bounds above: UnusableConfigError for a file
    that cannot be read or parsed, ConfigError naming each duplicated key."""
    try:
        with Path(path).open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise UnusableConfigError([f"{path}: cannot read the file ({exc.strerror})"]) from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise UnusableConfigError([f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnusableConfigError(
            [f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"]
        ) from exc
    try:
        loader = _BoundedLoader(text)  # refuses control characters (a binary file) at once
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except _TooLarge as exc:
        raise UnusableConfigError([f"{path}: {exc}"]) from exc
    except yaml.YAMLError as exc:
        raise UnusableConfigError([f"{path}: not valid YAML ({_yaml_problem(exc)})"]) from exc
    except ValueError as exc:  # an integer of more digits than Python converts
        raise UnusableConfigError([f"{path}: not valid YAML ({shorten(str(exc))})"]) from exc
    if loader.duplicates:
        raise ConfigError(loader.duplicates)
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error (PyYAML's own text spans several, with a snippet)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return shorten(" ".join(str(exc).split()), 200)


class _TooLarge(yaml.YAMLError):
    """The document exceeds a bound of read_yaml."""


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that, while composing the node graph and so before any Python object is
    built, refuses a document of more than MAX_YAML_NODES nodes once aliases are expanded or
    nested deeper than MAX_YAML_DEPTH, and collects duplicated keys (PyYAML keeps the last one
    silently). Floats written without a dot or an exponent sign (8e9, 8.03e9, 1.5E3) are
    floats, as in YAML 1.2; YAML 1.1 reads them as strings."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []
        self._expanded = 0  # nodes composed so far, an alias counting as all of its nodes
        self._sizes: dict[yaml.Node, int] = {}  # the expanded node count of each complete node
        self._path: list[str] = []  # segments of the key path down to the node being composed
        self._keys: dict[yaml.Node, set[tuple[str, str]]] = {}  # keys seen in each mapping

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            size = self._sizes.get(node) if node is not None else 0
            if size is None:
                raise _TooLarge("a YAML alias refers to a node that contains it")
            self._count(size)
            return node
        if len(self._path) >= MAX_YAML_DEPTH:
            raise _TooLarge(f"YAML nested deeper than {MAX_YAML_DEPTH} levels")
        self._path.append(_segment(parent, index))
        before = self._expanded
        node = super().compose_node(parent, index)
        self._path.pop()
        self._count(1)
        if node is not None:
            self._sizes[node] = self._expanded - before
            if isinstance(parent, yaml.MappingNode) and index is None:
                self._check_key(parent, node)
        return node

    def _count(self, nodes: int) -> None:
        self._expanded += nodes
        if self._expanded > MAX_YAML_NODES:
            raise _TooLarge(
                f"more than {MAX_YAML_NODES} YAML nodes once aliases are expanded (an alias bomb?)"
            )

    def _check_key(self, mapping: yaml.Node, key: yaml.Node) -> None:
        if not isinstance(key, yaml.ScalarNode):
            return
        seen = self._keys.setdefault(mapping, set())
        if (key.tag, key.value) in seen:
            path = _join([*self._path, _segment(mapping, key)])
            self.duplicates.append(
                f"{path}: duplicate key (line {key.start_mark.line + 1}); each key may appear once"
            )
        seen.add((key.tag, key.value))


_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _segment(parent: yaml.Node | None, index: Any) -> str:
    """The key path segment of the node composed under `parent` at `index` (PyYAML passes a
    sequence position, a mapping's key node, or None while composing a key)."""
    if isinstance(parent, yaml.SequenceNode):
        return f"[{index}]"
    if isinstance(index, yaml.ScalarNode):
        return shorten(str(index.value), 40)
    return ""


def _join(segments: list[str]) -> str:
    path = ""
    for segment in segments:
        if segment.startswith("[") or not path:
            path += segment
        elif segment:
            path += "." + segment
    return path or "(document)"
