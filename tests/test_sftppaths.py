"""tools/benchlib/sftppaths: SFTP requests decoded from an strace of sshfs, each with its path."""

from __future__ import annotations

import struct

from benchlib import sftppaths


def _s(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def _packet(kind: int, rid: int, *strings: bytes) -> bytes:
    body = bytes([kind]) + struct.pack(">I", rid) + b"".join(_s(x) for x in strings)
    return struct.pack(">I", len(body)) + body


def _dump(tid: int, call: str, data: bytes) -> list[str]:
    lines = [f'{tid} {call}(4, "...", {len(data)}) = {len(data)}']
    for off in range(0, len(data), 16):
        chunk = data[off : off + 16]
        lines.append(f" | {off:05x}  " + " ".join(f"{b:02x}" for b in chunk) + "  |")
    return lines


def test_each_request_is_counted_under_its_path_and_a_handle_under_the_path_it_opened():
    lines: list[str] = []
    lines += _dump(10, "writev", _packet(7, 1, b"/s/spool/incoming/a.json"))  # LSTAT
    lines += _dump(11, "writev", _packet(3, 2, b"/s/spool/pending/a.json"))  # OPEN
    lines.append("20 read(4,  <unfinished ...>")
    lines.append("12 read(3,  <unfinished ...>")  # another fd's read in between
    reply = _dump(20, "read", b"\0\0junk" + _packet(102, 2, b"H1"))  # a gap, then HANDLE H1
    reply[0] = reply[0].replace("20 read(4, ", "20 <... read resumed>")
    assert reply[0].startswith("20 <... read resumed>")
    lines += reply
    lines += _dump(11, "writev", _packet(4, 3, b"H1"))  # CLOSE of H1: the pending file
    lines += _dump(11, "writev", _packet(200, 4, b"fsync@openssh.com", b"H1"))
    lines += _dump(11, "writev", _packet(200, 5, b"posix-rename@openssh.com", b"/s/spool/a", b"/s/spool/b"))
    lines += _dump(11, "writev", _packet(4, 6, b"H9"))  # a handle opened before the trace
    got = sftppaths.requests_by_path("\n".join(lines), normalise=sftppaths.spool_names)
    assert got == {
        ("S/incoming/a.json", "LSTAT"): 1,
        ("S/pending/a.json", "OPEN"): 1,
        ("S/pending/a.json", "CLOSE"): 1,
        ("S/pending/a.json", "fsync"): 1,
        ("S/a", "posix-rename"): 1,
        ("?", "CLOSE"): 1,
    }


def test_a_drains_paths_are_made_generic():
    assert sftppaths.spool_names("/x/spool/attempts/noop-000012@1/3/work/noop-000012.txt") == (
        "S/attempts/J@1/N/work/J.txt"
    )
    h = "ab" * 32
    assert sftppaths.spool_names(f"/x/spool/store/sha256/ab/{h}.txt") == "S/store/sha256/xx/H.txt"
