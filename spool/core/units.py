"""The units ``spool.toml`` speaks: seconds, counts and sizes (``"20GiB"``).

Their own module so that every part with settings of its own (a kind's, a
provider's) can say what its values are without importing the whole
configuration (which reads those parts' settings in turn).
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

Seconds = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.I)
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(value: int | str) -> int:
    """``"20GiB"``, ``"500 MB"`` or a plain integer of bytes -> bytes."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a size such as 20GiB or 500MB")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
