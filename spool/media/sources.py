"""Sources of a job: a path a submitter wrote -> a real, probed, hashed media file.

Used by acceptance for every kind that reads media: a source must resolve
inside an asset root (symbolic links followed, then checked), be a regular
non-empty file that ffprobe reads directly (no playlists or concat lists), and
is hashed so every attempt can prove it renders what was accepted.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from spool.core.config import Config
from spool.core.errors import InvalidInput
from spool.core.model import Expect, Source
from spool.disk.store import sha256_file
from spool.media import probe


def resolve(role: str, text: object, roots: list[Path]) -> Path:
    """A source path -> its real path inside an asset root, or a rejection."""
    field = f"sources.{role}"
    if not isinstance(text, str):  # a source that names another job (spool.queue.depends)
        raise InvalidInput(field, "names another job, which this kind cannot take as a source")
    if "\x00" in text:
        raise InvalidInput(field, "contains a NUL character")
    if not roots:
        raise InvalidInput(
            field,
            "cannot be checked because spool.toml [assets] roots is empty; "
            "add the folder that holds your media",
        )
    try:
        given = Path(text).expanduser()
    except RuntimeError:  # "~name/..." for a user this host does not have
        raise InvalidInput(field, f"{text} starts with ~ for a user this host does not know") from None
    candidates = [given] if given.is_absolute() else [root / given for root in roots]
    for cand in candidates:
        if not os.path.lexists(cand):
            continue
        try:
            real = cand.resolve(strict=True)
        except RuntimeError:
            raise InvalidInput(field, f"{text} is a symbolic link loop") from None
        except OSError as exc:
            raise InvalidInput(field, f"{text} cannot be resolved ({exc.strerror})") from None
        if not any(real == root or root in real.parents for root in roots):
            raise InvalidInput(field, f"{text} resolves to {real}, outside the asset roots")
        return real
    raise InvalidInput(field, f"{text} does not exist")


def describe(role: str, path: Path, cfg: Config) -> Source:
    """stat, probe and hash one resolved source; never opens a FIFO or device."""
    return inspect(role, path, cfg)[0]


_memo = threading.local()


@contextmanager
def memoized() -> Iterator[None]:
    """Within it, a file already probed and hashed (same path, inode, size and times) is
    not probed and hashed again: a timeline using one medium many times, or a batch of
    dependents frozen from one upstream object (spool.queue.depends)."""
    outer = getattr(_memo, "cache", None)
    _memo.cache = {} if outer is None else outer
    try:
        yield
    finally:
        _memo.cache = outer


def inspect(role: str, path: Path, cfg: Config) -> tuple[Source, dict[str, Any]]:
    """:func:`describe`, and ffprobe's whole report (for a kind that checks more of it)."""
    field = f"sources.{role}"
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InvalidInput(field, f"{path} cannot be read ({exc.strerror})") from None
    cache = getattr(_memo, "cache", None)
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if cache is not None and key in cache:
        src, info = cache[key]
        return msgspec.structs.replace(src, role=role), info
    got = _inspect(role, path, cfg, st)
    if cache is not None:
        cache[key] = got
    return got


def _inspect(role: str, path: Path, cfg: Config, st: os.stat_result) -> tuple[Source, dict[str, Any]]:
    field = f"sources.{role}"
    if stat.S_ISDIR(st.st_mode):
        raise InvalidInput(field, f"{path} is a folder, not a media file")
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(field, f"{path} is not a regular file (device, FIFO or socket)")
    if st.st_size == 0:
        raise InvalidInput(field, f"{path} is empty")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError as exc:
        raise InvalidInput(field, f"{path} cannot be read ({exc.strerror})") from None
    try:
        info = probe.ffprobe(path, cfg.render.ffprobe)
    except probe.ProbeError as exc:
        raise InvalidInput(field, f"{path} is not media ffprobe can read ({exc})") from None
    if probe.is_indirect(info):
        raise InvalidInput(field, f"{path} is a playlist or concat list, which spool does not accept")
    digest, size = sha256_file(path)
    return Source(role=role, path=str(path), size=size, sha256=digest, probe=probe.summarize(info)), info


def merge_expect(defaults: Expect, stated: Expect) -> Expect:
    """Stated expectations win over the recipe's defaults, field by field."""
    values = {
        f: getattr(stated, f) if getattr(stated, f) is not None else getattr(defaults, f)
        for f in Expect.__struct_fields__
    }
    return Expect(**values)
