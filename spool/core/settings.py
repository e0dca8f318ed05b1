"""Typed overrides of ``spool.toml``: how tests, benchmarks and tools configure a spool.

Overrides are plain nested mappings, section -> key -> value, for example
``{"daemon": {"poll_interval": 0.2}, "limits": {"max_attempts": 2}}`` (``{"providers":
{"sim": {...}}}`` adds or replaces a whole ``[providers.sim]`` table). Every
section and key is checked against :class:`spool.core.config.Config` before
anything is written, so a renamed or misspelt setting fails loudly here
instead of leaving a default silently in force (which is what editing the
commented template by string replacement did).

Invariants:

* :func:`write` writes a file that :func:`spool.core.config.load` reads back to
  exactly the :class:`~spool.core.config.Config` it returns (checked on every write);
* a value the loader would refuse (a wrong type, a bound, a bad size) is
  refused here with the loader's own one-sentence error naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from spool.core import config
from spool.core.config import Config
from spool.core.decoding import convert
from spool.core.errors import ConfigError, InvalidInput
from spool.disk.tree import write_atomic

#: section -> key -> value, as in spool.toml.
Overrides = Mapping[str, Mapping[str, Any]]


class SettingsError(ValueError):
    """An override names a section or key that ``spool.toml`` does not have."""


def _fields(struct: type[msgspec.Struct]) -> list[str]:
    return [f.name for f in msgspec.structs.fields(struct)]


def _section_types() -> dict[str, type[msgspec.Struct]]:
    return {f.name: f.type for f in msgspec.structs.fields(Config)}


def check(overrides: Overrides) -> None:
    """Refuse any section or key the typed Config does not have (values are checked later)."""
    sections = _section_types()
    for section, values in overrides.items():
        if section not in sections:
            raise SettingsError(
                f"[{section}] is not a section of spool.toml (sections: {', '.join(sections)})"
            )
        if not isinstance(values, Mapping):
            raise SettingsError(f"[{section}] must be a table of key = value, not {type(values).__name__}")
        if not isinstance(sections[section], type):
            continue  # a table of named tables ([providers.<name>]): the loader checks each
        keys = _fields(sections[section])
        for key in values:
            if key not in keys:
                raise SettingsError(
                    f"{section}.{key} is not a setting of spool.toml ([{section}] has: {', '.join(keys)})"
                )


def apply(overrides: Overrides, base: Config | None = None) -> Config:
    """``base`` (default: all defaults) with ``overrides`` applied, checked as the loader checks."""
    check(overrides)
    data: dict[str, dict[str, Any]] = msgspec.to_builtins(base if base is not None else Config())
    for section, values in overrides.items():
        data[section] = {**data[section], **values}
    try:
        cfg = convert(data, Config)
    except InvalidInput as exc:
        raise ConfigError(f"settings: {exc.field}", exc.problem) from None
    return config.parse(dump(cfg).encode(), "settings")  # the loader's own checks (sizes, ...)


def dump(cfg: Config) -> str:
    """The TOML text of every setting of ``cfg`` (sections and keys in Config's order;
    a setting that is ``None`` is left out, which the loader reads as its default)."""
    data: dict[str, Any] = msgspec.to_builtins(cfg)
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    out = ["# spool.toml written by spool.core.settings: every key, typed and checked.\n"]
    out += [f"{k} = {_value(v, k)}\n" for k, v in top.items() if v is not None]
    for section, table in data.items():
        if section in top:
            continue
        out.append(f"\n[{section}]\n")
        out += [f"{k} = {_value(v, f'{section}.{k}')}\n" for k, v in table.items() if v is not None]
    return "".join(out)


def write(path: Path, overrides: Overrides | None = None, *, base: Config | None = None) -> Config:
    """Write ``spool.toml`` at ``path``: ``base`` (default: what ``path`` holds now, or all
    defaults) with ``overrides`` applied. Returns the Config the file now loads as."""
    cfg = apply(overrides or {}, config.load(path) if base is None else base)
    text = dump(cfg)
    if config.parse(text.encode(), str(path)) != cfg:  # a value TOML cannot carry faithfully
        raise SettingsError(f"{path}: the written settings would not read back as given")
    write_atomic(path, text.encode())
    return cfg


def _value(v: object, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    if isinstance(v, dict):  # a table inside a section: an inline table
        items = [f"{_string(str(k))} = {_value(x, f'{where}.{k}')}" for k, x in v.items() if x is not None]
        return "{" + ", ".join(items) + "}"
    raise SettingsError(f"{where}: a {type(v).__name__} cannot be written to spool.toml")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(s: str) -> str:
    """A TOML basic string: quotes, backslashes and every control character escaped."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
