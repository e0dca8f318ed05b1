"""Which path each SFTP request of an sshfs mount was about, from an strace of sshfs.

``tools/multimount --trace`` logs each request's type, not its path. To see where a
job's requests go, sshfs itself is traced while a workload runs::

    strace -f -qq -p <sshfs pid> -e trace=write,writev,read,readv -e write=4 -e read=4 -o DUMP

(fd 4 is sshfs's socket to its ssh: every request and reply crosses it unencrypted).
:func:`requests_by_path` decodes the dump: each request's type and first path, and for a
request on a handle (READ, WRITE, CLOSE, FSTAT, READDIR, fsync) the path its OPEN or
OPENDIR named, from the HANDLE reply. Used by hand (``python -m benchlib.sftppaths DUMP
JOBS``) to find what a layout costs a file server (docs/benchmarks.md, 2026-12-04).
"""

from __future__ import annotations

import re
import struct
import sys
from collections import Counter
from collections.abc import Callable, Iterator

#: SFTP v3 packet types (draft-ietf-secsh-filexfer-02).
TYPES = {
    3: "OPEN", 4: "CLOSE", 5: "READ", 6: "WRITE", 7: "LSTAT", 8: "FSTAT", 9: "SETSTAT",
    10: "FSETSTAT", 11: "OPENDIR", 12: "READDIR", 13: "REMOVE", 14: "MKDIR", 15: "RMDIR",
    16: "REALPATH", 17: "STAT", 18: "RENAME", 200: "EXTENDED",
}  # fmt: skip
_ON_HANDLE = {4, 5, 6, 8, 10, 12}
_HANDLE_REPLY = 102
_CALL = re.compile(r"^(\d+)\s+(\w+)\((\d+),")
_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. (\w+) resumed>")
_HEX = re.compile(r"^\s*\|\s*[0-9a-f]{5}\s+((?:[0-9a-f]{2}\s+)+)")
_WRITES = ("write", "writev", "sendmsg")


def _string(body: bytes, off: int) -> tuple[bytes, int]:
    (n,) = struct.unpack(">I", body[off : off + 4])
    return body[off + 4 : off + 4 + n], off + 4 + n


#: SFTP v3 reply types: STATUS, HANDLE, DATA, NAME, ATTRS, EXTENDED_REPLY.
_REPLIES = {101, 102, 103, 104, 105, 201}


def _packets(data: bytes, kinds: set[int] | None = None) -> Iterator[bytes]:
    """The packets in ``data``; with ``kinds``, a stream that may have gaps (a read strace
    did not dump) is resynchronised on the next plausible packet of those types."""
    i = 0
    while i + 5 <= len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        body = data[i + 4 : i + 4 + n]
        if kinds is not None and (not 5 <= n <= 1 << 20 or len(body) < n or body[0] not in kinds):
            i += 1
            continue
        if len(body) < n or not body:
            return
        i += 4 + n
        yield body


def _streams(dump: str, fd: str) -> tuple[list[bytes], bytes]:
    """The bytes written to ``fd``, one entry per system call (each holds whole requests),
    and the bytes read from it, in order (one reader thread)."""
    writes: list[bytearray] = []
    read = bytearray()
    cur: bytearray | None = None
    unfinished: dict[str, tuple[str, str]] = {}
    for line in dump.splitlines():
        call = fdno = None
        if m := _CALL.match(line):
            tid, call, fdno = m.groups()
            if "<unfinished" in line:
                unfinished[tid] = (call, fdno)
                cur = None
                continue
        elif m := _RESUMED.match(line):
            call, fdno = unfinished.pop(m.group(1), (m.group(2), ""))
        elif (m := _HEX.match(line)) and cur is not None:
            cur.extend(bytes.fromhex(m.group(1).replace(" ", "")))
            continue
        else:
            if line[:1].isdigit():
                cur = None
            continue
        if fdno != fd:
            cur = None
        elif call in _WRITES:
            writes.append(bytearray())
            cur = writes[-1]
        else:
            cur = read
    return [bytes(w) for w in writes], bytes(read)


def requests_by_path(
    dump: str, fd: str = "4", normalise: Callable[[str], str] = lambda p: p
) -> Counter[tuple[str, str]]:
    """(path, request) -> how many, from an strace dump of sshfs (see the module docstring).
    An EXTENDED request is counted by its extension's name (``posix-rename``, ``hardlink``,
    ``fsync``); a handle whose OPEN was not in the dump counts under ``?``."""
    writes, read = _streams(dump, fd)
    requests = [p for w in writes for p in _packets(w)]
    handle_of: dict[int, bytes] = {}
    for p in _packets(read, _REPLIES):
        if p[0] == _HANDLE_REPLY:
            (rid,) = struct.unpack(">I", p[1:5])
            handle_of[rid] = _string(p, 5)[0]
    # sshfs reuses a handle once it is closed: each one names the path of the last OPEN
    # that got it, in the order the requests were sent.
    opened: dict[bytes, str] = {}
    out: Counter[tuple[str, str]] = Counter()
    for p in requests:
        kind = p[0]
        if kind in (3, 11):
            (rid,) = struct.unpack(">I", p[1:5])
            if rid in handle_of:
                opened[handle_of[rid]] = _string(p, 5)[0].decode(errors="replace")
        name = TYPES.get(kind, str(kind))
        if kind == 200:
            ext, off = _string(p, 5)
            arg, _ = _string(p, off)
            name = ext.decode(errors="replace").split("@")[0]
            path = opened.get(arg, "?") if name == "fsync" else arg.decode(errors="replace")
        elif kind in _ON_HANDLE:
            path = opened.get(_string(p, 5)[0], "?")
        else:
            path = _string(p, 5)[0].decode(errors="replace")
        out[(normalise(path), name)] += 1
    return out


def spool_names(path: str) -> str:
    """A path of a no-op drain with its job, attempt, hash and temp parts made generic."""
    for pat, sub in (
        (r".*/spool/?", "S/"), (r"[0-9a-f]{64}", "H"), (r"sha256/[0-9a-f]{2}", "sha256/xx"),
        (r"/\.[^/]*\.tmp$", "/.TMP"), (r"_segments/[^/]*", "_segments/SEG"), (r"\.new\.[^/]*", ".new.X"),
        (r"[a-z]+-?\d{5,6}", "J"), (r"/\d+(/|$)", r"/N\1"),
    ):  # fmt: skip
        path = re.sub(pat, sub, path)
    return path


def main(argv: list[str]) -> int:
    dump, jobs = argv[0], int(argv[1])
    with open(dump, errors="replace") as f:
        got = requests_by_path(f.read(), normalise=spool_names)
    total = sum(got.values())
    print(f"{total} requests, {total / jobs:.1f} a job")
    by_path: Counter[str] = Counter()
    for (path, _), n in got.items():
        by_path[path] += n
    for path, n in by_path.most_common(40):
        kinds = ", ".join(f"{k} {v / jobs:.2f}" for (p, k), v in got.most_common() if p == path)
        print(f"{n / jobs:7.2f}  {path[:64]:64}  {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
