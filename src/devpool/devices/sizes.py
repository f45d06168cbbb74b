"""Memory sizes as users write them ("8GiB", "512MiB", "1.5GB") ⇄ bytes, parsed once at the edge."""

from __future__ import annotations

import math
import re

# Binary units are what GPU tools report (nvidia-smi's "MiB"); decimal ones are accepted
# as Kubernetes and Ray users write them: "8G" and "8GB" are 8·10⁹, "8Gi" and "8GiB" 8·2³⁰.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[A-Za-z]*)\s*")
EXAMPLES = "e.g. '8GiB', '512MiB' or '1.5GB'"


def parse_size(value: object) -> int:
    """Bytes from '8GiB', '512MiB', '1.5GB', '80Gi' or a whole number of bytes.

    ValueError (with a short phrase of what was expected) for anything else, zero included.
    """
    if isinstance(value, bool):
        raise ValueError(f"a memory size, {EXAMPLES}")
    if isinstance(value, int):
        number, unit = float(value), ""
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value)) is not None:
        number, unit = float(match["number"]), match["unit"].lower()
    else:
        raise ValueError(f"a memory size, {EXAMPLES}")
    if unit not in _UNITS:
        raise ValueError(f"a memory size with a unit such as GiB, MiB or GB ({EXAMPLES})")
    size = math.ceil(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"a memory size above zero, {EXAMPLES}")
    return size


def format_size(size: float) -> str:
    """Bytes in the largest binary unit that keeps a number ≥ 1: '8 GiB', '14.2 GiB', '512 MiB'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size:g} B"
