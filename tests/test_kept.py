"""spool.disk.kept: readings of folders kept while a stat shows them unchanged (the
dependency sweep's listings, the metrics' gauges)."""

from __future__ import annotations

import os
import time

from spool.disk import kept
from spool.disk.kept import Kept


def test_a_folder_changed_in_the_tick_it_was_read_is_read_again(tmp_path):
    """SFTP carries whole seconds: a name added in the second of the listing leaves the
    folder's mtime as it was, so a recent mtime is not trusted; an old one is."""
    folder = tmp_path / "f"
    folder.mkdir()
    seen = Kept()

    def count() -> int:
        return len(os.listdir(folder))

    now = time.time()
    assert seen.get("f", (folder,), count, now) == 0
    st = folder.stat()
    (folder / "a").touch()
    os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same tick: the mtime did not move
    assert seen.get("f", (folder,), count, now + 1) == 1, "a racy reading is read again"
    past = int((now - 60) * 1e9)
    os.utime(folder, ns=(past, past))
    assert seen.get("f", (folder,), count, now + 2) == 1
    assert seen.get("f", (folder,), count, now + 3) == 1
    assert seen.reads["f"] == 3, "an old, unchanged mtime is trusted"
    (folder / "b").touch()
    assert seen.get("f", (folder,), count, now + 4) == 2


def test_a_kept_reading_is_read_again_after_max_age_and_after_forget(tmp_path, monkeypatch):
    """A NAS client's attribute cache can hide another host's change from the stat:
    ``max_age`` bounds how long any reading is kept; ``forget`` drops one at once."""
    folder = tmp_path / "f"
    folder.mkdir()
    past = int((time.time() - 60) * 1e9)
    os.utime(folder, ns=(past, past))
    clock = [1000.0]
    monkeypatch.setattr(kept.time, "monotonic", lambda: clock[0])
    seen = Kept(max_age=30.0)
    assert seen.get("k", (folder,), lambda: "first") == "first"
    clock[0] += 29
    assert seen.get("k", (folder,), lambda: "second") == "first"
    clock[0] += 2
    assert seen.get("k", (folder,), lambda: "third") == "third"
    seen.forget("k")
    assert seen.get("k", (folder,), lambda: "fourth") == "fourth"
    assert seen.reads["k"] == 3


def test_names_lists_a_missing_folder_as_empty_and_sees_it_made(tmp_path):
    folder = tmp_path / "later"
    assert kept.names(folder) == []
    folder.mkdir()
    (folder / "x").touch()
    assert kept.names(folder) == ["x"], "a folder made since is listed (its stat changed)"
