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

from spool.core.errors import InvalidInput

T = TypeVar("T")

_AT = re.compile(r"^(?P<msg>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.S)
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
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
    # A lone surrogate can only come from a \u escape (the bytes were valid UTF-8): look
    # for one only when the text has a \uD800-\uDFFF escape at all (most never do).
    bad = _unpaired_surrogate(value, "") if _SURROGATE_ESCAPE.search(text) else None
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
            sub = f"{path}.{display_key(k)}" if path else display_key(k)
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
        field, problem = explain(exc, typ, value)
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        raise InvalidInput(field, problem) from None


def display_key(key: str) -> str:
    """A key as it can appear in a field path: plain, or JSON-quoted (so spaces,
    newlines and lone surrogates stay on one readable, encodable line)."""
    if _PLAIN_KEY.match(key):
        return key

    return json.dumps(key)


def explain(exc: msgspec.ValidationError, root: Any, value: Any = None) -> tuple[str, str]:
    """A msgspec error -> (dotted field path, one-sentence problem).

    ``value`` (the input) lets an error inside a mapping (``$.tags[...]`` or
    a bad key) name the entry that caused it.
    """
    m = _AT.match(str(exc))
    assert m is not None
    msg, path = m.group("msg"), (m.group("path") or "")
    field = path.lstrip(".")
    in_key = bool(m.group("key"))
    if (in_key or field.endswith("[...]")) and value is not None:
        dict_path = path[:-5] if field.endswith("[...]") else path
        bad = _bad_entry(value, root, dict_path)
        text = msg.replace("`", "")
        text = text[:1].lower() + text[1:]
        base = dict_path.lstrip(".")
        if bad is not None:
            where = _join(base, display_key(bad))
            return (where, f"is not an accepted name ({text})") if in_key else (where, text)
        return base, f"has an entry that is not accepted ({text})"
    if mm := re.match(r"Object contains unknown field `(.*)`", msg, re.S):
        name = display_key(mm.group(1))
        allowed = _field_names(_member(_type_at(root, path), value, path))
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return _join(field, name), f"is not a known field{hint}"
    if mm := re.match(r"Object missing required field `(.*)`", msg, re.S):
        return _join(field, display_key(mm.group(1))), "is required but missing"
    if mm := re.match(r"Invalid (?:enum )?value (.+)", msg):
        choices = _choices(_type_at(root, path))
        hint = f"; use one of {', '.join(choices)}" if choices else ""
        return field, f"{mm.group(1)} is not an accepted value{hint}"
    text = msg.replace("`", "")
    return field, text[:1].lower() + text[1:]


def _member(t: msgspec.inspect.Type | None, value: Any, path: str) -> msgspec.inspect.Type | None:
    """For a tagged union, the member struct the input's tag selects."""
    if not isinstance(t, msgspec.inspect.UnionType) or value is None:
        return t
    node = value
    try:
        for name, index, _ in _SEGMENT.findall(path):
            node = node[name] if name else node[int(index)]
    except (KeyError, IndexError, TypeError, ValueError):
        return t
    for s in t.types:
        if (
            isinstance(s, msgspec.inspect.StructType)
            and isinstance(node, dict)
            and node.get(s.tag_field) == s.tag
        ):
            return s
    return t


def _bad_entry(value: Any, root: Any, dict_path: str) -> str | None:
    """The first key of the mapping at ``dict_path`` whose entry alone fails to convert."""
    segments = [(n, int(i) if i else None) for n, i, _ in _SEGMENT.findall(dict_path)]
    target = value
    try:
        for name, index in segments:
            target = target[name] if name else target[index]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(target, dict):
        return None
    for key in list(target):
        trial = _replace_at(value, segments, {key: target[key]})
        try:
            msgspec.convert(trial, root)
        except msgspec.ValidationError as exc:
            m = _AT.match(str(exc))
            if m is not None and (m.group("path") or "").startswith(dict_path):
                return str(key)
    return None


def _replace_at(value: Any, segments: list[tuple[str, int | None]], new: Any) -> Any:
    """A shallow copy of ``value`` with the node at ``segments`` replaced by ``new``."""
    if not segments:
        return new
    (name, index), rest = segments[0], segments[1:]
    if name:
        return {**value, name: _replace_at(value[name], rest, new)}
    assert index is not None
    out = list(value)
    out[index] = _replace_at(value[index], rest, new)
    return out


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
