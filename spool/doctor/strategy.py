"""The strategies the findings imply: how outputs are published, how the daemon watches,
and what the operator is warned about. Pure functions of the config and the findings."""

from __future__ import annotations

from ..config import Config
from .mount import Mount
from .report import Choice, Finding


def choose_publish(cfg: Config, links: Finding) -> Choice:
    pinned = cfg.filesystem.publish
    if pinned != "auto":
        return Choice(pinned, "pinned in spool.toml ([filesystem] publish)", True)
    if links.ok:
        return Choice("link", "hard links work and never replace an existing name", False)
    return Choice("copy", f"hard links cannot be trusted here ({links.summary}): copy, fsync, re-hash", False)


def choose_watch(cfg: Config, mount: Mount, inotify: Finding) -> Choice:
    pinned = cfg.daemon.watch
    if pinned != "auto":
        return Choice(pinned, "pinned in spool.toml ([daemon] watch)", True)
    every = f"rescan every {cfg.daemon.poll_interval:g} s"
    if not inotify.facts.get("this_mount"):
        return Choice("poll", f"inotify gives no events here; {every}", False)
    if "other_mount" in inotify.facts:
        if inotify.facts["other_mount"]:
            return Choice("inotify", "inotify sees changes made through other mounts too", False)
        return Choice("poll", f"inotify misses changes made through other mounts; {every}", False)
    if mount.kind in ("local", "memory"):
        return Choice("inotify", f"a {mount.kind} filesystem: every change goes through this kernel", False)
    return Choice(
        "poll", f"{mount.fstype} is shared: inotify never sees other hosts' changes; {every}", False
    )


def warnings(cfg: Config, mount: Mount, f: dict[str, Finding], publish: Choice, watch: Choice) -> list[str]:
    out = []
    if mount.kind == "sync-drive":
        out.append(
            f"UNSAFE: the spool is on {mount.fstype}, a cloud or sync-drive mount. Such mounts broke "
            "rename (two winners), replace (delete then move), O_EXCL and mkdir in tests; do not "
            "share a spool through it: use NFS, SMB or sshfs."
        )
    elif mount.kind in ("fuse", "other"):
        out.append(f"{mount.fstype} is not a filesystem spool knows; treated as shared (polling).")
    if f["rename_race"].ok is False:
        out.append(f"UNSAFE: {f['rename_race'].summary}; claims by rename cannot be trusted here.")
    if not f["rename"].facts.get("replaces", True):
        out.append(f"UNSAFE: {f['rename'].summary}; records cannot be rewritten in place here.")
    elif f["rename"].ok is False:
        out.append(f"{f['rename'].summary}: rewritten records (heartbeats) can be missing for a moment.")
    if f["fsync"].ok is False:
        out.append(f"{f['fsync'].summary}: records may not survive a crash of the file server.")
    if f["locks"].ok is False:
        out.append(f"{f['locks'].summary}: two daemons of one identity on this host are not kept apart.")
    if f["space"].ok is False:
        out.append(f["space"].summary + ".")
    if publish.pinned and publish.value == "link" and not f["links"].ok:
        out.append(
            f'[filesystem] publish = "link" is pinned, but {f["links"].summary}; the store copies instead.'
        )
    shared = mount.kind not in ("local", "memory")
    if watch.pinned and watch.value == "inotify" and shared:
        out.append(
            f'[daemon] watch = "inotify" on a shared {mount.fstype}: other hosts\' drops are still '
            f"only seen by the rescan every {cfg.daemon.poll_interval:g} s."
        )
    lag = f["lag"].facts.get("listing_seconds")
    if shared and cfg.recovery.stale_after < max(60.0, 3 * (lag or 0)):
        out.append(
            f"[recovery] stale_after = {cfg.recovery.stale_after:g} s is short for a shared mount"
            + (f" whose listings lag {lag:.0f} s" if lag else "")
            + ": use at least 60 s (nas.md 4.5)."
        )
    return out
