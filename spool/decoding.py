"""Strict decoding of untrusted JSON and TOML into typed structs, with errors
that name the field.

msgspec does the typing; this module adds what a submission format needs on
top of it: strict UTF-8, no duplicate keys, no NaN/Infinity, and one readable
sentence per error (``recipe.steps[2].op: 'blur' is not one of trim, fit, ...``).
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

import msgspec

from .errors import InvalidInput

T = TypeVar("T")

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[(?:'|\")([^'\"]*)(?:'|\")\]")


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(data: bytes, what: str = "submission") -> Any:
    """Bytes -> plain JSON values, strictly: UTF-8, no duplicate keys, no NaN."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(what, f"is not UTF-8 text (invalid byte at offset {exc.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except _DuplicateKey as exc:
        raise InvalidInput(what, f"key {str(exc)!r} appears twice in one object") from None
    except ValueError as exc:
        msg = str(exc)
        if isinstance(exc, json.JSONDecodeError):
            msg = f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        raise InvalidInput(what, msg) from None
    except RecursionError:
        raise InvalidInput(what, "is nested too deeply") from None
    bad = _unpaired_surrogate(value, "")
    if bad is not None:
        raise InvalidInput(
            bad or what, "contains an unpaired surrogate escape (such as \\ud800), which is not text"
        )
    return value


def _unpaired_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string that cannot be UTF-8 (a lone \\udXXX escape)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if (found := _unpaired_surrogate(k, sub)) is not None or (
                found := _unpaired_surrogate(v, sub)
            ) is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if (found := _unpaired_surrogate(v, f"{path}[{i}]")) is not None:
                return found
    return None


def convert(value: Any, typ: type[T], prefix: str = "") -> T:
    """Plain values -> ``typ``, raising :class:`InvalidInput` that names the field."""
    try:
        return msgspec.convert(value, typ)
    except msgspec.ValidationError as exc:
        field, problem = explain(exc, typ)
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        raise InvalidInput(field, problem) from None


def explain(exc: msgspec.ValidationError, root: Any) -> tuple[str, str]:
    """A msgspec error -> (dotted field path, one-sentence problem)."""
    m = _AT.match(str(exc))
    assert m is not None
    msg, path = m.group("msg"), (m.group("path") or "")
    field = path.lstrip(".")
    if mm := re.match(r"Object contains unknown field `(.+)`", msg):
        name = mm.group(1)
        allowed = _field_names(_type_at(root, path))
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return _join(field, name), f"is not a known field{hint}"
    if mm := re.match(r"Object missing required field `(.+)`", msg):
        return _join(field, mm.group(1)), "is required but missing"
    if mm := re.match(r"Invalid (?:enum )?value (.+)", msg):
        choices = _choices(_type_at(root, path))
        hint = f"; use one of {', '.join(choices)}" if choices else ""
        return field, f"{mm.group(1)} is not an accepted value{hint}"
    text = msg.replace("`", "")
    return field, text[:1].lower() + text[1:]


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _type_at(root: Any, path: str) -> msgspec.inspect.Type | None:
    """Walk a msgspec type along a ``$``-path as printed in errors."""
    t: msgspec.inspect.Type | None = msgspec.inspect.type_info(root)
    for m in _SEGMENT.finditer(path):
        if t is None:
            return None
        t = _unwrap(t)
        name, index, key = m.groups()
        if name is not None and isinstance(t, msgspec.inspect.StructType):
            t = next((f.type for f in t.fields if f.encode_name == name), None)
        elif name is not None and isinstance(t, msgspec.inspect.UnionType):
            t = _union_field(t, name)
        elif index is not None and isinstance(t, msgspec.inspect.ListType):
            t = t.item_type
        elif key is not None and isinstance(t, msgspec.inspect.DictType):
            t = t.value_type
        else:
            return None
    return _unwrap(t) if t is not None else None


def _unwrap(t: msgspec.inspect.Type) -> msgspec.inspect.Type:
    if isinstance(t, msgspec.inspect.Metadata):
        return _unwrap(t.type)
    if isinstance(t, msgspec.inspect.UnionType):
        real = [x for x in t.types if not isinstance(x, msgspec.inspect.NoneType)]
        if len(real) == 1:
            return _unwrap(real[0])
    return t


def _union_field(t: msgspec.inspect.UnionType, name: str) -> msgspec.inspect.Type | None:
    """For a tagged union, the tag field's choices are every member's tag."""
    structs = [x for x in t.types if isinstance(x, msgspec.inspect.StructType)]
    if structs and structs[0].tag_field == name:
        return msgspec.inspect.LiteralType(tuple(s.tag for s in structs))
    return None


def _choices(t: msgspec.inspect.Type | None) -> list[str]:
    if isinstance(t, msgspec.inspect.LiteralType):
        return [str(v) for v in t.values]
    if isinstance(t, msgspec.inspect.EnumType):
        return [str(m.value) for m in t.cls]
    return []


def _field_names(t: msgspec.inspect.Type | None) -> list[str]:
    if isinstance(t, msgspec.inspect.StructType):
        return [f.encode_name for f in t.fields]
    return []
