"""The strategies the findings imply: how outputs are published, how the daemon watches,
and what the operator is warned about. Pure functions of the config and the findings."""

from __future__ import annotations

from dataclasses import dataclass

from spool.core.config import Config
from spool.disk.mount import Mount
from spool.doctor.report import Choice, Finding


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


@dataclass(frozen=True)
class Verdict:
    """Whether a spool may live here, and on what ground: ``measured`` (the probes across
    two mounts showed it), ``name`` (only the filesystem's name was known) or ``local``."""

    safe: bool
    basis: str
    why: str


#: What spool relies on across clients, as the probes through ``--peer`` measure it.
MEASURED = ("rename", "rename_race", "links", "o_excl", "lag")


def _unsafe_measured(f: dict[str, Finding]) -> list[str]:
    """What was measured to break a property spool relies on (whatever the mount's name)."""
    out = []
    if not f["rename"].facts.get("replaces", True):
        out.append(f"{f['rename'].summary}: records cannot be rewritten in place")
    if f["rename_race"].ok is False:
        out.append(f"{f['rename_race'].summary}: claims by rename cannot be trusted")
    if f["links"].facts.get("exclusive") is False:
        out.append(
            f"{f['links'].summary}: a record written once (manifest, generation state) can be replaced"
        )
    return out


def _holds(key: str, f: dict[str, Finding]) -> bool | None:
    """Whether what spool relies on of probe ``key`` held across two mounts (``None``: not
    measured across). A replace the peer sees with a gap is no break: readers retry it."""
    x = f[key]
    if key == "rename":
        return x.facts.get("replaces") is not False if "peer" in x.facts else None
    if key in ("links", "o_excl"):
        return x.facts.get("exclusive") is True if "race_rounds" in x.facts else None
    return x.ok


def verdict(mount: Mount, f: dict[str, Finding]) -> Verdict:
    """Safe or not from what was measured; the name list only speaks before anything was.

    A mount measured unsafe is unsafe whatever its name. A mount on the cloud and
    sync-drive list (such mounts broke rename, replace, O_EXCL and mkdir in tests)
    is unsafe until ``--peer`` has measured renames (replace, races), hard links,
    O_EXCL and listing lag across two mounts, and safe once all of them hold."""
    broken = _unsafe_measured(f)
    if broken:
        return Verdict(False, "measured", "; ".join(broken))
    held = {k: _holds(k, f) for k in MEASURED}
    measured = all(v is not None for v in held.values())
    if mount.kind != "sync-drive":
        local = mount.kind in ("local", "memory")
        basis = "measured" if measured else "local" if local else "name"
        return Verdict(True, basis, f"{mount.fstype}: nothing measured breaks what spool relies on")
    if not measured:
        return Verdict(
            False,
            "name",
            f"{mount.fstype} is a cloud or sync-drive mount by name, and such mounts broke rename (two "
            "winners), replace (delete then move), O_EXCL and mkdir in tests; not measured across two "
            "mounts yet: run spool doctor --peer OTHER_MOUNT to measure it",
        )
    short = [LABEL[k] for k, v in held.items() if not v]
    if short:
        return Verdict(
            False,
            "measured",
            f"{mount.fstype} is on the cloud and sync-drive list and measured short on " + ", ".join(short),
        )
    gaps = f["rename"].facts["peer"].get("missing", 0)
    seen = f"the peer saw it missing {gaps} times; readers retry" if gaps else "atomic as the peer sees it"
    return Verdict(
        True,
        "measured",
        f"{mount.fstype} is on the cloud and sync-drive list by name, but measured across two mounts it "
        f"keeps what spool relies on: rename replaces ({f['rename'].facts.get('rounds', 0)} replacements; "
        f"{seen}), one winner in {f['rename_race'].facts.get('rounds', 0)} of "
        f"{f['rename_race'].facts.get('rounds', 0)} rename races, hard links that never replace "
        f"({f['links'].facts.get('race_rounds', 0)} link races), O_EXCL exact "
        f"({f['o_excl'].facts.get('race_rounds', 0)} races), a new name listed through the peer "
        f"after {f['lag'].facts.get('listing_seconds')} s",
    )


LABEL = {"rename": "rename", "rename_race": "rename races", "links": "hard links", "o_excl": "O_EXCL",
         "lag": "listing lag"}  # fmt: skip


def warnings(
    cfg: Config, mount: Mount, f: dict[str, Finding], publish: Choice, watch: Choice, judged: Verdict
) -> list[str]:
    out = []
    if not judged.safe:
        out.append(f"UNSAFE: {judged.why}; do not share a spool through it (NFS, SMB, sshfs, JuiceFS work).")
    elif mount.kind == "sync-drive":
        out.append(f"{judged.why}: treated as a shared filesystem (polling).")
    elif mount.kind in ("fuse", "other"):
        out.append(f"{mount.fstype} is not a filesystem spool knows; treated as shared (polling).")
    if f["rename"].facts.get("replaces", True) and f["rename"].ok is False:
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
            + ": use at least 60 s (docs/research/nas.md 4.5)."
        )
    # The longer of the two lags: a new name not listed yet, a moved one still found.
    lags = [v for k in ("listing_seconds", "stale_stat_seconds") if (v := f["lag"].facts.get(k)) is not None]
    late = max(lags, default=None)
    if shared and late is not None and cfg.recovery.mount_lag < 2 * late:
        out.append(
            f"[recovery] mount_lag = {cfg.recovery.mount_lag:g} s is short for a mount that shows "
            f"another's changes {late:g} s late: recovering a worker gone on another mount of this "
            f"host may miss its last writes (a generation's provider job); use at least {2 * late:g} s."
        )
    return out
