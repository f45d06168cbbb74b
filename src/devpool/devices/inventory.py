"""--devices SPEC and [tool.devpool.platforms] -> Inventory: which platform, which physical ids."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from devpool.devices.detection import ascend, cuda, rocm
from devpool.devices.sizes import parse_size
from devpool.errors import DevpoolError, check_keys, did_you_mean

__all__ = [
    "AUTO_ORDER",
    "BUILTIN_PLATFORMS",
    "KINDS",
    "NO_ACCELERATOR",
    "NO_DEVICES",
    "Detector",
    "Inventory",
    "Platform",
    "detect",
    "device_memory",
    "format_ids",
    "load_platforms",
    "named_ids",
    "parse_ids",
    "resolve_inventory",
]

KINDS = ("cuda", "rocm", "ascend", "sim")

# Order in which `auto` looks (and every command that detects as it does); sim never is.
AUTO_ORDER = ("cuda", "ascend", "rocm")

# Guards against `0-999999999` allocating a huge list; no host has more devices than this.
_MAX_ID = 65535

_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IDS_RE = re.compile(r"\d+(?:-\d+)?(?:\s*,\s*\d+(?:-\d+)?)*")
_TABLE = "[tool.devpool.platforms]"
_TABLE_KEYS = ("kind", "visible-env", "ray-resource", "memory")
_DETECTED_BY = {"cuda": "nvml/nvidia-smi", "ascend": "npu-smi", "rocm": "rocm-smi"}


@dataclass(frozen=True)
class Platform:
    """A named device platform: its kind, visibility variable and Ray resource name."""

    name: str
    kind: str
    visible_env: str | None
    ray_resource: str
    memory: int | None = None  # bytes per device, [tool.devpool.platforms] memory = "80GiB"


BUILTIN_PLATFORMS: dict[str, Platform] = {
    "cuda": Platform("cuda", "cuda", "CUDA_VISIBLE_DEVICES", "GPU"),
    "rocm": Platform("rocm", "rocm", "HIP_VISIBLE_DEVICES", "GPU"),
    "ascend": Platform("ascend", "ascend", "ASCEND_RT_VISIBLE_DEVICES", "NPU"),
    "sim": Platform("sim", "sim", "DEVPOOL_SIM_VISIBLE_DEVICES", "SIM"),
}

# What `--devices auto` gives on a host with no accelerator: CPU tests run, device tests
# are unsatisfiable. Neither its name nor its kind matches a platforms([...]) marker, and
# with no devices nothing ever probes, checks or leases one of its kind.
NO_DEVICES = Platform("none", "none", None, "none")
NO_ACCELERATOR = "auto: no accelerator found (looked for NVIDIA, Ascend and ROCm devices)"

Detector = Callable[[float], list[int] | None]


def format_ids(ids: Iterable[int]) -> str:
    """Sorted ids as text with runs of three or more compressed: [0,1,2,3,5,6] -> '0-3,5,6'."""
    ordered = sorted(set(ids))
    parts: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{ordered[start]}-{ordered[end]}")
        else:
            parts.extend(str(i) for i in ordered[start : end + 1])
        start = end + 1
    return ",".join(parts)


@dataclass(frozen=True)
class Inventory:
    """The devices this session may use: one platform and its physical ids."""

    platform: Platform
    devices: tuple[int, ...]
    source: str

    def describe(self) -> str:
        """Short form for the header, e.g. 'cuda:0,2,5 (3 devices)'."""
        count = len(self.devices)
        if count == 0:
            return "no devices"
        noun = "device" if count == 1 else "devices"
        return f"{self.platform.name}:{format_ids(self.devices)} ({count} {noun})"


# --- configuration -------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return type(value).__name__


def _platform_from_table(name: str, entry: Mapping[object, object]) -> Platform:
    where = f"{_TABLE} {name}"
    check_keys(entry, _TABLE_KEYS, f"tool.devpool.platforms.{name}")
    builtin = BUILTIN_PLATFORMS.get(name)
    kind_value = entry.get("kind")
    if kind_value is None:
        if builtin is None:
            raise DevpoolError(f"{where}: missing kind; expected one of {', '.join(KINDS)}")
        kind = builtin.kind
    elif not isinstance(kind_value, str):
        raise DevpoolError(f"{where}: kind must be a string, not {_type_name(kind_value)}")
    else:
        kind = _check_kind(name, kind_value)
    base = BUILTIN_PLATFORMS[kind]

    visible_env: str | None = base.visible_env
    if "visible-env" in entry:
        value = entry["visible-env"]
        if value is False:
            visible_env = None
        elif isinstance(value, str) and _ENV_NAME_RE.fullmatch(value):
            visible_env = value
        else:
            raise DevpoolError(
                f"{where}: visible-env must be an environment variable name or false, not {value!r}"
            )

    ray_resource = base.ray_resource
    if "ray-resource" in entry:
        value = entry["ray-resource"]
        if not isinstance(value, str) or not value.strip():
            raise DevpoolError(f"{where}: ray-resource must be a non-empty string, not {value!r}")
        ray_resource = value
    memory = None
    if "memory" in entry:
        try:
            memory = parse_size(entry["memory"])
        except ValueError as exc:
            raise DevpoolError(f"{where}: memory must be {exc}, not {entry['memory']!r}") from None
    return Platform(name, kind, visible_env, ray_resource, memory)


def _check_kind(name: str, kind: str) -> str:
    if kind not in KINDS:
        raise DevpoolError(
            f"{_TABLE} {name}: unknown kind {kind!r}"
            f"{did_you_mean(kind, KINDS) or '; expected one of ' + ', '.join(KINDS)}"
        )
    builtin = BUILTIN_PLATFORMS.get(name)
    if builtin is not None and builtin.kind != kind:
        raise DevpoolError(
            f"{_TABLE} {name}: the built-in platform {name} has kind {builtin.kind}, "
            f"not {kind!r}; give your platform another name"
        )
    return kind


def load_platforms(table: Mapping[str, object] | None) -> dict[str, Platform]:
    """Built-ins plus the project's [tool.devpool.platforms] entries."""
    platforms = dict(BUILTIN_PLATFORMS)
    if table is None:
        return platforms
    if not isinstance(table, Mapping):
        raise DevpoolError(
            f"{_TABLE} must be a table of NAME = KIND or NAME = {{ kind = KIND, ... }}, "
            f"not {_type_name(table)}"
        )
    for name, entry in table.items():
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise DevpoolError(
                f"{_TABLE} {name!r}: a platform name must start with a letter and hold "
                "only letters, digits, '_' and '-'"
            )
        if name == "auto":
            raise DevpoolError(f"{_TABLE} auto: 'auto' is reserved for --devices auto")
        if isinstance(entry, str):
            kind = _check_kind(name, entry)
            base = BUILTIN_PLATFORMS[kind]
            platforms[name] = Platform(name, kind, base.visible_env, base.ray_resource)
        elif isinstance(entry, Mapping):
            platforms[name] = _platform_from_table(name, entry)
        else:
            raise DevpoolError(
                f'{_TABLE} {name}: expected a kind such as "ascend" or a table '
                f"{{ kind = ..., visible-env = ..., ray-resource = ... }}, "
                f"not {_type_name(entry)}"
            )
    return platforms


# --- ids -----------------------------------------------------------------------------------


def parse_ids(text: str) -> list[int]:
    """'0-3,5,7' -> [0, 1, 2, 3, 5, 7]; sorted, no duplicates allowed."""
    if not text.strip():
        raise DevpoolError("device ids are empty: expected ids and ranges like 0-3,5,7")
    seen: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            raise DevpoolError(f"device ids {text!r} have an empty part between commas")
        if part.startswith("-"):
            raise DevpoolError(f"device ids {text!r}: {part!r} is negative")
        low_text, dash, high_text = part.partition("-")
        low_text, high_text = low_text.strip(), high_text.strip()
        if not low_text.isdecimal() or (dash and not high_text.isdecimal()):
            raise DevpoolError(f"device ids {text!r}: {part!r} is not an id or a range like 0-3")
        low = int(low_text)
        high = int(high_text) if dash else low
        if high < low:
            raise DevpoolError(f"device ids {text!r}: range {part!r} runs backwards")
        if high > _MAX_ID:
            raise DevpoolError(f"device ids {text!r}: {part!r} goes above {_MAX_ID}")
        ids = set(range(low, high + 1))
        repeated = ids & seen
        if repeated:
            raise DevpoolError(f"device ids {text!r}: {part!r} repeats {format_ids(repeated)}")
        seen |= ids
    return sorted(seen)


# --- detection -----------------------------------------------------------------------------


def detect(kind: str, timeout: float = 10.0) -> list[int] | None:
    """Physical device ids of one kind on this host, None when none can be seen."""
    if kind == "cuda":
        return cuda.detect(timeout)
    if kind == "ascend":
        return ascend.detect(timeout)
    if kind == "rocm":
        return rocm.detect(timeout)
    if kind == "sim":
        return None
    raise ValueError(f"unknown device kind {kind!r}; expected one of {', '.join(KINDS)}")


def device_memory(
    platform: Platform, devices: Iterable[int], timeout: float = 10.0
) -> dict[int, int]:
    """Total memory of each device in bytes; {} where it cannot be known.

    The platform's configured memory wins (it is the only source for sim); otherwise NVML
    or nvidia-smi for cuda, rocm-smi for rocm, npu-smi for ascend.
    """
    ids = list(devices)
    if platform.memory is not None:
        return dict.fromkeys(ids, platform.memory)
    if platform.kind == "cuda":
        return cuda.memory(ids, timeout)
    if platform.kind == "rocm":
        return rocm.memory(ids, timeout)
    if platform.kind == "ascend":
        return ascend.memory(ids, timeout)
    return {}


# --- resolution ----------------------------------------------------------------------------


def _malformed(spec: str) -> DevpoolError:
    return DevpoolError(
        f"--devices {spec!r} is malformed: expected auto, PLATFORM, PLATFORM:IDS or IDS, "
        "e.g. cuda:0-7 or 0,2,5"
    )


def _visible_ids(
    platform: Platform, environ: Mapping[str, str], allow_uuid: bool
) -> tuple[set[int], str] | None:
    """Ids a pre-set visibility variable allows and 'VAR=value', or None when it is off/unset."""
    var = platform.visible_env
    if var is None or var not in environ:
        return None
    value = environ[var].strip()
    shown = f"{var}={environ[var]}"
    if value in ("", "-1"):
        raise DevpoolError(f"{shown} hides every {platform.name} device; unset it or list ids")
    entries = [e.strip() for e in value.split(",")]
    ids = {int(e) for e in entries if e.isdecimal()}
    named = [e for e in entries if not e.isdecimal()]
    if not named:
        return ids, shown
    if platform.kind != "cuda" or not all(e.startswith(("GPU-", "MIG-")) for e in named):
        raise DevpoolError(f"{shown} is not a comma-separated list of device ids")
    if not allow_uuid:
        raise DevpoolError(
            f"{shown} names devices by UUID, which explicit --devices ids cannot be checked "
            f"against; use --devices auto or --devices {platform.name}, or set {var} to indexes"
        )
    table = cuda.uuid_indexes()
    if table is None:
        raise DevpoolError(
            f"could not map the UUIDs in {shown} to device indexes: "
            "nvidia-smi --query-gpu=index,uuid failed"
        )
    for entry in named:
        # CUDA accepts any unique UUID prefix, so we do too.
        matches = {index for uuid, index in table.items() if uuid.startswith(entry)}
        if len(matches) != 1:
            why = "matches no device" if not matches else "matches several devices"
            raise DevpoolError(f"could not map {entry!r} in {shown} to a device index: {why}")
        ids |= matches
    return ids, shown


def _narrow(
    platform: Platform,
    detected: list[int],
    environ: Mapping[str, str],
    source: str,
) -> tuple[list[int], str]:
    found = _visible_ids(platform, environ, allow_uuid=True)
    if found is None:
        return detected, source
    visible, shown = found
    missing = sorted(visible - set(detected))
    if missing:
        raise DevpoolError(
            f"{shown} lists {platform.name} devices "
            f"{','.join(map(str, missing))} that detection did not find "
            f"(found {format_ids(detected)})"
        )
    kept = [i for i in detected if i in visible]
    if not kept:
        raise DevpoolError(f"{shown} leaves no {platform.name} devices")
    return kept, f"{source}, narrowed by {shown}"


def _check_visible(
    spec: str,
    platform: Platform,
    ids: list[int],
    environ: Mapping[str, str],
    allow_uuid: bool,
) -> None:
    found = _visible_ids(platform, environ, allow_uuid)
    if found is None:
        return
    visible, shown = found
    hidden = [i for i in ids if i not in visible]
    if hidden:
        raise DevpoolError(
            f"--devices {spec} asks for devices {','.join(map(str, hidden))} that "
            f"{shown} hides; ask for a subset of {format_ids(visible)} "
            f"or unset {platform.visible_env}"
        )


def _check_detected(spec: str, platform: Platform, ids: list[int], detected: list[int]) -> None:
    absent = [i for i in ids if i not in detected]
    if absent:
        raise DevpoolError(
            f"--devices {spec} asks for {platform.name} devices "
            f"{','.join(map(str, absent))} that this host does not have "
            f"(found {format_ids(detected)})"
        )


def _parse_spec_ids(spec: str, text: str) -> list[int]:
    try:
        return parse_ids(text)
    except DevpoolError as error:
        raise DevpoolError(f"--devices {spec}: {error}") from None


def named_ids(spec: str) -> tuple[str, list[int]] | None:
    """(platform, ids) of a PLATFORM:IDS spec, checked as --devices checks it (a mistake is
    one sentence naming the spec); None for the other forms (auto, a platform, bare ids)."""
    name, colon, ids_text = spec.strip().partition(":")
    if not colon:
        return None
    if not _NAME_RE.fullmatch(name) or name == "auto" or not _IDS_RE.fullmatch(ids_text):
        raise _malformed(spec)
    return name, _parse_spec_ids(spec, ids_text)


def resolve_inventory(
    spec: str,
    platforms: Mapping[str, Platform],
    environ: Mapping[str, str],
    detectors: Mapping[str, Callable[[], list[int] | None]] | None = None,
) -> Inventory:
    """Turn a --devices SPEC into an Inventory, narrowed by a pre-set visibility variable."""
    chosen = dict(detectors or {})

    def run_detector(kind: str) -> list[int]:
        found = chosen[kind]() if kind in chosen else detect(kind)
        return sorted(set(found or ()))

    def first_found() -> tuple[Platform, list[int]] | None:
        for kind in AUTO_ORDER:
            found = run_detector(kind)
            if found:
                return platforms.get(kind, BUILTIN_PLATFORMS[kind]), found
        return None

    def auto_platform(ids: list[int]) -> tuple[Platform, list[int]]:
        """The platform ids without one are on; the sentence names what the user wrote."""
        first = first_found()
        if first is not None:
            return first
        for kind in AUTO_ORDER:  # ids a pre-set visibility variable hides: say that first
            _check_visible(spec, platforms.get(kind, BUILTIN_PLATFORMS[kind]), ids, environ, True)
        raise DevpoolError(
            f"--devices {spec.strip()} gives device ids without a platform, and this host has "
            "no accelerator to put them on (looked for NVIDIA, Ascend and ROCm devices); "
            f"name the platform, e.g. --devices sim:{spec.strip()}"
        )

    def known(name: str) -> Platform:
        if name not in platforms:
            raise DevpoolError(
                f"--devices {spec}: unknown platform {name!r}; known platforms are "
                f"{', '.join(sorted(platforms))} (add others under {_TABLE})"
            )
        return platforms[name]

    text = spec.strip()
    named = named_ids(spec)
    if named is not None:
        name, ids = named
        ids_text = text.partition(":")[2]
        platform = known(name)
        _check_visible(spec, platform, ids, environ, allow_uuid=False)
        if platform.kind != "sim" and not run_detector(platform.kind):
            # Tests that need the hardware would otherwise run beside it and read green.
            raise DevpoolError(
                f"--devices {text}: this host has no {platform.name} device "
                f"({_DETECTED_BY[platform.kind]} found none, or its driver is missing); "
                f"to run on simulated devices, write --devices sim:{ids_text}"
            )
        return Inventory(platform, tuple(ids), f"--devices {text}")

    if text == "auto":
        first = first_found()
        if first is None:
            # A laptop with `devices = "auto"` in pyproject still runs the CPU tests.
            return Inventory(NO_DEVICES, (), NO_ACCELERATOR)
        platform, found = first
        kept, source = _narrow(platform, found, environ, f"auto: {_DETECTED_BY[platform.kind]}")
        return Inventory(platform, tuple(kept), source)

    if _IDS_RE.fullmatch(text):
        ids = _parse_spec_ids(spec, text)
        platform, found = auto_platform(ids)
        _check_detected(spec, platform, ids, found)
        _check_visible(spec, platform, ids, environ, allow_uuid=True)
        return Inventory(platform, tuple(ids), f"--devices {text} on {platform.name} (detected)")

    if _NAME_RE.fullmatch(text):
        platform = known(text)
        if platform.kind == "sim":
            raise DevpoolError(
                f"--devices {spec}: {platform.name} devices cannot be detected; give ids, "
                f"e.g. --devices {platform.name}:0-7"
            )
        found = run_detector(platform.kind)
        if not found:
            raise DevpoolError(
                f"--devices {spec} found no {platform.name} devices "
                f"({_DETECTED_BY[platform.kind]} saw none); name them, e.g. "
                f"--devices {platform.name}:0-7"
            )
        kept, source = _narrow(platform, found, environ, f"--devices {text}: detected")
        return Inventory(platform, tuple(kept), source)

    raise _malformed(spec)
