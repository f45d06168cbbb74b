"""[tool.devpool.paths] and [tool.devpool.markers]: requests for tests that say nothing in
devpool's own markers, read from where a test lives or from the project's own markers.

They become devpool's markers on the test at collection, before devpool reads markers, so
one reader (markers.request_for) serves them all. Per part of a request (devices, ports,
resources, timeout, platforms) a devpool marker of the test wins over an alias, an alias
over a path rule, and among path rules the most specific key wins.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from devpool.devices.sizes import parse_size
from devpool.errors import DevpoolError, did_you_mean

# Request keys, in the order their markers are written; "devices_per_rank" goes with ranks.
REQUEST_KEYS = (
    "device_count",
    "ranks",
    "devices_per_rank",
    "device_memory",
    "ports",
    "cpus",
    "resources",
    "timeout",
    "platforms",
)
# Each part of a request is settled by one source; a test's own marker of the part settles
# it. Devices are one part: a test that names its devices keeps all of that.
PARTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # part: (request keys, devpool markers on a test that settle it)
    "devices": (
        ("device_count", "ranks", "devices_per_rank", "device_memory"),
        ("device_count", "ranks", "nodes", "device_memory", "device_exclusive"),
    ),
    "ports": (("ports",), ("ports",)),
    "cpus": (("cpus",), ("cpus",)),
    "resources": (("resources",), ("resources",)),
    "timeout": (("timeout",), ("timeout",)),
    "platforms": (("platforms",), ("platforms",)),
}
# Keys an alias may read from its marker's arguments: (least value, whole number?).
_COUNTS = {"device_count": 0, "ranks": 1, "devices_per_rank": 0, "ports": 0, "cpus": 1}
_POSITION = re.compile(r"args\[(\d+)\]")


@dataclass(frozen=True)
class Argument:
    """An alias's value read from its marker: a keyword argument, or a position."""

    keyword: str | None = None
    position: int | None = None

    def describe(self) -> str:
        return f"{self.keyword}=" if self.keyword else f"args[{self.position}]"

    def read(self, mark: pytest.Mark) -> tuple[bool, object]:
        """(found, value) in one use of the marker."""
        if self.keyword is not None:
            return self.keyword in mark.kwargs, mark.kwargs.get(self.keyword)
        assert self.position is not None
        found = self.position < len(mark.args)
        return found, mark.args[self.position] if found else None


@dataclass(frozen=True)
class RuleRequest:
    """One rule's request: key → value, a fixed value or (aliases) an Argument."""

    values: tuple[tuple[str, Any], ...]

    def get(self, key: str) -> Any:
        return dict(self.values).get(key)

    def keys(self) -> set[str]:
        return {key for key, _ in self.values}

    def describe(self) -> str:
        def text(value: Any) -> str:
            if isinstance(value, Argument):
                return f"<{value.describe()}>"
            if isinstance(value, tuple) and value and isinstance(value[0], tuple):
                return "{" + ", ".join(f"{k}={v}" for k, v in value) + "}"
            return repr(list(value)) if isinstance(value, tuple) else repr(value)

        return "{ " + ", ".join(f"{key} = {text(value)}" for key, value in self.values) + " }"


@dataclass(frozen=True)
class PathRule:
    """One [tool.devpool.paths] key: a folder, a file or a glob relative to the rootdir."""

    key: str
    request: RuleRequest
    parts: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(PurePosixPath(self.key).parts))

    @property
    def is_glob(self) -> bool:
        return any(ch in self.key for ch in "*?[")

    def depth(self, path: Sequence[str]) -> int:
        """How many leading parts of path (a file, rootdir-relative) it matches; -1: none.

        A key matches a file or a folder above it (".", the rootdir, at 0); the deepest
        such match counts."""
        for length in range(len(path), -1, -1):
            if _match(self.parts, tuple(path[:length])):
                return length
        return -1

    def specificity(self, path: Sequence[str]) -> tuple[int, int, int]:
        """Greater is more specific: the deeper match, then more literal parts, then fewer
        wildcard characters."""
        literal = sum(1 for part in self.parts if not any(ch in part for ch in "*?["))
        wild = sum(self.key.count(ch) for ch in "*?[")
        return (self.depth(path), literal, -wild)


def _match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Segment by segment, fnmatch in each; ** matches any number of segments."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], head) and _match(rest, path[1:])


@dataclass(frozen=True)
class Rules:
    """The project's path rules and marker aliases, parsed and checked."""

    paths: tuple[PathRule, ...] = ()
    aliases: Mapping[str, RuleRequest] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.paths or self.aliases)

    def path_rule(self, nodeid: str, path: Sequence[str]) -> PathRule | None:
        """The most specific key covering path; two equally specific keys that ask for
        different things are a mistake, named."""
        matching = [rule for rule in self.paths if rule.depth(path) >= 0]
        if not matching:
            return None
        best = max(rule.specificity(path) for rule in matching)
        top = [rule for rule in matching if rule.specificity(path) == best]
        if len({rule.request for rule in top}) > 1:
            keys = " and ".join(repr(rule.key) for rule in top)
            raise DevpoolError(
                f"{nodeid}: [tool.devpool.paths] keys {keys} both cover it, neither more "
                "specific, and ask for different things; add a key for it, or narrow one"
            )
        return min(top, key=lambda rule: rule.key)


# --- parsing ---------------------------------------------------------------------------------


def _value(
    key: str,
    raw: object,
    where: str,
    aliases: bool,
    platforms: Collection[str],
    resources: Mapping[str, int],
) -> Any:
    """One checked value of a rule; where names the rule, e.g. '[tool.devpool.paths] "x"'."""
    if aliases and isinstance(raw, str) and (key in _COUNTS or key == "timeout"):
        if (found := _POSITION.fullmatch(raw)) is not None:
            return Argument(position=int(found.group(1)))
        if raw.isidentifier():
            return Argument(keyword=raw)
        raise DevpoolError(
            f"{where} {key} = {raw!r} names no argument: write a keyword's name "
            "(num_gpus) or a position (args[0])"
        )
    if key in _COUNTS:
        least = _COUNTS[key]
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < least:
            hint = ' (a string names the argument to read, e.g. "num_gpus" or "args[0]")'
            raise DevpoolError(
                f"{where} {key} must be a whole number ≥ {least}, got {raw!r}"
                + (hint if aliases else "")
            )
        return raw
    if key == "timeout":
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0:
            raise DevpoolError(f"{where} timeout must be a number of seconds ≥ 0, got {raw!r}")
        return raw
    if key == "device_memory":
        try:
            parse_size(raw)
        except ValueError as exc:
            raise DevpoolError(f"{where} device_memory needs {exc}, got {raw!r}") from None
        return raw
    if key == "platforms":
        names = [raw] if isinstance(raw, str) else raw
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise DevpoolError(f"{where} platforms must be a list of platform names, got {raw!r}")
        unknown = [name for name in names if name not in platforms]
        if unknown:
            raise DevpoolError(
                f"{where} platforms names unknown platform {unknown[0]!r}; known: "
                f"{', '.join(sorted(platforms))} (add others under [tool.devpool.platforms])"
            )
        return tuple(names)
    assert key == "resources"
    if not isinstance(raw, dict) or not raw:
        raise DevpoolError(f"{where} resources must be a table of name = count, got {raw!r}")
    for name, count in raw.items():
        if name not in resources:
            declared = ", ".join(sorted(resources)) or "none"
            raise DevpoolError(
                f"{where} resources names unknown resource {name!r}; declared under "
                f"[tool.devpool.resources]: {declared}"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise DevpoolError(f"{where} resources {name} must be a whole number ≥ 1")
    return tuple(sorted(raw.items()))


def _request(
    raw: object, where: str, aliases: bool, platforms: Collection[str], resources: Mapping[str, int]
) -> RuleRequest:
    if not isinstance(raw, dict) or not raw:
        raise DevpoolError(
            f"{where} must be a table of request keys, e.g. {{ device_count = 1 }}, got {raw!r}"
        )
    for key in raw:
        if key not in REQUEST_KEYS:
            hint = did_you_mean(str(key), REQUEST_KEYS) or f"; known: {', '.join(REQUEST_KEYS)}"
            raise DevpoolError(f"{where} has unknown request key {key!r}{hint}")
    if "devices_per_rank" in raw and "ranks" not in raw:
        raise DevpoolError(f"{where} devices_per_rank needs ranks beside it")
    values = tuple(
        (key, _value(key, raw[key], where, aliases, platforms, resources))
        for key in REQUEST_KEYS
        if key in raw
    )
    return RuleRequest(values)


def request_values(
    raw: dict[str, Any], where: str, platforms: Collection[str], resources: Mapping[str, int]
) -> dict[str, Any]:
    """One request table's checked values, as a path rule takes them (plan/once.py too)."""
    return dict(_request(raw, where, False, platforms, resources).values)


def _path_key(key: str, where: str) -> str:
    path = PurePosixPath(key.replace("\\", "/"))
    if not key.strip() or path.is_absolute() or ".." in path.parts:
        raise DevpoolError(
            f"{where}: [tool.devpool.paths] key {key!r} must be a folder, file or glob "
            "relative to the rootdir (no leading / and no ..)"
        )
    return path.as_posix()


def parse_rules(
    table: Mapping[str, Any],
    where: str,
    platforms: Collection[str],
    resources: Mapping[str, int] | None = None,
    owned: Collection[str] = (),
) -> Rules:
    """[tool.devpool] paths and markers → Rules; DevpoolError names the key on a mistake.

    owned: marker names devpool reads itself, which no alias may take."""
    resources = resources or {}
    paths, markers = table.get("paths", {}), table.get("markers", {})
    for name, value in (("paths", paths), ("markers", markers)):
        if not isinstance(value, dict):
            raise DevpoolError(f"{where}: [tool.devpool.{name}] must be a table")
    rules = []
    seen: dict[str, str] = {}
    for key, raw in paths.items():
        clean = _path_key(key, where)
        if clean in seen:
            raise DevpoolError(
                f"{where}: [tool.devpool.paths] keys {seen[clean]!r} and {key!r} name one path"
            )
        seen[clean] = key
        place = f"{where}: [tool.devpool.paths] {key!r}"
        rules.append(PathRule(clean, _request(raw, place, False, platforms, resources)))
    aliases = {}
    for name, raw in markers.items():
        if name in owned:
            raise DevpoolError(
                f"{where}: [tool.devpool.markers] {name!r} is a marker devpool reads itself; "
                "an alias names one of the project's own markers"
            )
        if not name.isidentifier():
            raise DevpoolError(f"{where}: [tool.devpool.markers] {name!r} is not a marker name")
        place = f"{where}: [tool.devpool.markers] {name}"
        aliases[name] = _request(raw, place, True, platforms, resources)
    return Rules(tuple(rules), aliases)


# --- applying ---------------------------------------------------------------------------------


def _resolve(nodeid: str, name: str, mark: pytest.Mark, request: RuleRequest) -> dict[str, Any]:
    """An alias's request for one test, its arguments read from the marker."""
    values = {}
    for key, value in request.values:
        if isinstance(value, Argument):
            found, got = value.read(mark)
            use = f"@pytest.mark.{name}"
            if not found:
                raise DevpoolError(
                    f"{nodeid}: {use} has no {value.describe()} argument, which "
                    f"[tool.devpool.markers] {name} reads as {key}"
                )
            least = _COUNTS.get(key, 0)
            whole = isinstance(got, int) and not isinstance(got, bool)
            number = whole or (key == "timeout" and isinstance(got, float))
            if not number or got < least:  # type: ignore[operator]
                kind = "a number of seconds" if key == "timeout" else "a whole number"
                raise DevpoolError(
                    f"{nodeid}: {use} gives {value.describe()} {got!r}, which "
                    f"[tool.devpool.markers] {name} reads as {key}: it must be {kind} ≥ {least}"
                )
            value = got
        values[key] = value
    return values


def _marks(values: Mapping[str, Any], keys: Iterable[str]) -> list[pytest.MarkDecorator]:
    """devpool's markers for these keys of a resolved request."""
    marks = []
    keys = set(keys)
    if "device_count" in keys and values.get("device_count"):  # 0: no device, said explicitly
        marks.append(pytest.mark.device_count(values["device_count"]))
    if "ranks" in keys and "ranks" in values:
        per_rank = values.get("devices_per_rank")
        kwargs = {} if per_rank is None else {"devices_per_rank": per_rank}
        marks.append(pytest.mark.ranks(values["ranks"], **kwargs))
    if "device_memory" in keys and "device_memory" in values:
        marks.append(pytest.mark.device_memory(values["device_memory"]))
    if "ports" in keys and values.get("ports"):
        marks.append(pytest.mark.ports(values["ports"]))
    if "cpus" in keys and "cpus" in values:
        marks.append(pytest.mark.cpus(values["cpus"]))
    if "resources" in keys and "resources" in values:
        marks.append(pytest.mark.resources(**dict(values["resources"])))
    if "timeout" in keys and "timeout" in values:
        marks.append(pytest.mark.timeout(values["timeout"]))
    if "platforms" in keys and "platforms" in values:
        marks.append(pytest.mark.platforms(list(values["platforms"])))
    return marks


def relative_parts(path: Path, rootpath: Path) -> tuple[str, ...] | None:
    """A test file's path relative to the rootdir, as parts; None outside it."""
    try:
        return path.resolve().relative_to(rootpath.resolve()).parts
    except ValueError:
        return None


def apply(items: Sequence[pytest.Item], rules: Rules, rootpath: Path) -> dict[str, dict[str, str]]:
    """Add devpool's markers the rules give to each test; per test, where each part of its
    request came from: part → "marker", "alias NAME" or "path KEY"."""
    from devpool.plan.markers import closest_marks

    sources: dict[str, dict[str, str]] = {}
    files: dict[Path, tuple[str, ...] | None] = {}  # each test file's parts, resolved once
    for item in items:
        marks = closest_marks(item)
        own = {part for part, (_, names) in PARTS.items() if any(n in marks for n in names)}
        found = {part: "marker" for part in own}
        alias = _closest_alias(item, rules.aliases)
        given: list[tuple[str, dict[str, Any]]] = []
        if alias is not None:
            name, mark = alias
            given.append((f"alias {name}", _resolve(item.nodeid, name, mark, rules.aliases[name])))
        parts = None
        if rules.paths:
            path = Path(str(item.path))
            if path not in files:
                files[path] = relative_parts(path, rootpath)
            parts = files[path]
        rule = rules.path_rule(item.nodeid, parts) if parts else None
        if rule is not None:
            given.append((f"path {rule.key}", dict(rule.request.values)))
        for source, values in given:
            for part, (keys, _) in PARTS.items():
                if part in found or not set(keys) & set(values):
                    continue
                found[part] = source
                for mark in _marks(values, keys):
                    item.add_marker(mark)
        sources[item.nodeid] = found
    return sources


def _closest_alias(item: pytest.Item, aliases: Mapping[str, RuleRequest]) -> tuple[str, Any] | None:
    """The alias marker nearest the test (pytest's closest-wins), if any."""
    if not aliases:
        return None
    for mark in item.iter_markers():
        if mark.name in aliases:
            return mark.name, mark
    return None


def unmatched(rules: Rules, items: Sequence[pytest.Item], rootpath: Path) -> list[str]:
    """Path keys that cover none of these tests."""
    if not rules.paths:
        return []
    files = {relative_parts(path, rootpath) for path in {Path(str(i.path)) for i in items}}
    paths = [parts for parts in files if parts]
    return [rule.key for rule in rules.paths if not any(rule.depth(p) >= 0 for p in paths)]


def owned_markers() -> frozenset[str]:
    """Markers devpool reads itself: no alias may take their names."""
    from devpool.plan.markers import MARKERS

    return frozenset(MARKERS) | {"depends_on"}


def rules_from(table: Mapping[str, Any], where: str, settings: Any) -> Rules:
    """The Rules of a [tool.devpool] table, checked against the run's platforms and
    resources (settings: config.Settings)."""
    return parse_rules(table, where, settings.platforms, settings.resources, owned_markers())


class RuleMarkers:
    """The pytest plugin: after the other collection hooks, each test gets the markers its
    rules give, before devpool reads markers (in pytest_collection_finish)."""

    def __init__(self, rules: Rules, warn: bool = True) -> None:
        self.rules = rules
        self.warn = warn  # the controller says which path keys cover no test; a worker not
        self.sources: dict[str, dict[str, str]] = {}
        self.unmatched: list[str] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        try:
            self.sources = apply(items, self.rules, config.rootpath)
        except DevpoolError as exc:
            raise pytest.UsageError(str(exc)) from None
        narrowed = config.args_source == pytest.Config.ArgsSource.ARGS or any(
            getattr(config.option, name, "") for name in ("keyword", "markexpr")
        )
        if self.warn and not narrowed:  # a run of a part of the suite covers a part
            self.unmatched = unmatched(self.rules, items, config.rootpath)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for key in self.unmatched:
            terminalreporter.write_line(
                f"devpool: [tool.devpool.paths] {key!r} matches no collected test", yellow=True
            )
