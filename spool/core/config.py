"""``spool.toml`` -> typed configuration, with one clear error naming the key.

Operator limits live here and only here: nothing a job says can raise them.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from spool.core.decoding import convert
from spool.core.errors import ConfigError, InvalidInput
from spool.core.units import PositiveInt, Seconds, parse_size
from spool.kinds.generate.providers.config import parse_providers, secret_names

if TYPE_CHECKING:
    from spool.kinds.generate.providers.config import ProviderConfig


class Assets(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: Folders sources may come from, checked after resolving symlinks.
    #: Relative entries are relative to the spool folder.
    roots: list[str] = []


class Limits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    max_active: PositiveInt = 2
    temp_disk: int | str = "20GiB"
    job_timeout: Seconds = 3600.0
    max_attempts: PositiveInt = 3
    nice: Annotated[int, msgspec.Meta(ge=0, le=19)] = 10
    ionice: Annotated[int, msgspec.Meta(ge=0, le=7)] = 7
    memory: int | str = 0
    output_size: int | str = 0

    @property
    def temp_disk_bytes(self) -> int:
        return parse_size(self.temp_disk)

    @property
    def memory_bytes(self) -> int:
        return parse_size(self.memory)

    @property
    def output_size_bytes(self) -> int:
        return parse_size(self.output_size)


class Acceptance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    required_tags: list[str] = msgspec.field(
        default_factory=lambda: ["campaign", "locale", "asset_type", "visibility"]
    )
    max_submission_bytes: PositiveInt = 1 << 20
    #: Accept ``"operation": "noop"`` jobs (no media work; benchmarks and tests only).
    allow_noop: bool = False


class Validation(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    decode_check: Literal["full", "sampled", "none"] = "sampled"
    duration_tolerance: Annotated[float, msgspec.Meta(ge=0)] = 0.1
    sample_windows: PositiveInt = 3
    sample_seconds: Seconds = 0.5
    #: Measure the integrated loudness (EBU R128) of an output with audio (one audio-only
    #: decoding pass) and keep it in the version record; not a check, a measurement.
    measure_loudness: bool = True


class Daemon(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    poll_interval: Seconds = 2.0
    heartbeat_interval: Seconds = 5.0
    stop_grace: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    watch: Literal["auto", "inotify", "poll"] = "auto"
    #: A drop in incoming/ that no inotify event showed closed or renamed in is
    #: taken once its size and mtime stayed unchanged this long (spool/queue/arrivals.py).
    incoming_quiet: Seconds = 2.0


class Recovery(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: A worker whose heartbeat has not advanced for this long is suspect (another
    #: host) or stalled (this host, its process alive: stopped or wedged).
    stale_after: Seconds = 120.0
    #: Take over a suspect worker's jobs without an operator (off: a stale heartbeat
    #: is a reason to look, not a licence to act).
    auto_recover: bool = False
    #: How late a change made through another client of a shared spool (another host,
    #: or another mount on this host) may show through this mount: its client caches.
    #: A worker seen dead or stopped that wrote through another client is recovered
    #: only once it has been seen so for this long, so that recovery sees its last
    #: writes (a generation's provider job) and does not do them again. 60 s covers
    #: NFS's longest default attribute cache; sshfs caches 20 s, JuiceFS 1 s.
    mount_lag: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    #: Technical retries wait backoff * 2^(k-1) seconds, at most backoff_max.
    backoff: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    backoff_max: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    #: Keep attempts' work/ folders this long after the job ended (spool gc).
    work_retention: Annotated[float, msgspec.Meta(ge=0)] = 7 * 86400.0


class Health(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Telling a broken node from a bad job (spool.queue.health, spool.queue.blocklist)."""

    #: A job that failed with host-class errors on this many different workers is
    #: failed as its own fault (with each worker's evidence); before that it moves on.
    fail_after_workers: Annotated[int, msgspec.Meta(ge=1, le=100)] = 2
    #: A worker quarantines itself after this many host-class failures in a row.
    quarantine_after: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 3
    #: Render a tiny clip with every step kind and encoder at start; refuse to claim if one fails.
    self_check: bool = True


class Render(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    ffmpeg: str = "ffmpeg"
    ffprobe: str = "ffprobe"
    font_file: str = ""
    threads: Annotated[int, msgspec.Meta(ge=0)] = 0


class Layers(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where text and logos may sit (spool.kinds.render.layers): a fraction of the frame kept
    centred (0.9 = 90 % title-safe) or a preset name such as ``"social"``."""

    safe_area: (
        Annotated[float, msgspec.Meta(ge=0.5, le=1.0)]
        | Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9-]{0,31}$")]
    ) = 0.9


class Observe(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How the queue is watched: metrics files, the status page, thumbnails."""

    #: Folder of the Prometheus textfiles (``spool-<worker>.prom``); relative to the
    #: spool folder unless absolute; empty = no metrics files.
    metrics_dir: str = "metrics"
    metrics_interval: Seconds = 15.0
    #: ``spool serve``'s default address, ``HOST:PORT``.
    bind: str = "127.0.0.1:8470"
    #: Seconds between the status page's updates (it backs off when the server is away).
    page_refresh: Seconds = 5.0
    #: Width in pixels of the poster-frame JPEG made after publish; 0 = none.
    thumbnail_width: Annotated[int, msgspec.Meta(ge=0, le=1920)] = 320


class Secrets(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: Environment variables whose values are secrets, besides *TOKEN*, *SECRET*, ...
    env: list[str] = []
    #: Files holding secrets (provider tokens), kept outside the spool.
    files: list[str] = []


class Permissions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: The umask every spool process applies: "0002" lets a studio group share
    #: the spool (folders 2775, files 664), "0022" keeps it to one user.
    umask: Annotated[str, msgspec.Meta(pattern=r"^0?[0-7]{3}$")] = "0022"

    @property
    def umask_bits(self) -> int:
        return int(self.umask, 8)


class Filesystem(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Strategies that depend on the spool's filesystem (``spool doctor`` probes it)."""

    #: How validated outputs enter the store: ``link`` (hard link), ``copy`` (copy,
    #: fsync, re-hash), or ``auto``: the daemon's start-up probe decides.
    publish: Literal["auto", "link", "copy"] = "auto"


class Library(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The asset library (SPEC section 9)."""

    #: Visibility values search lists without --visibility: a discovery filter that
    #: fails closed (filesystem permissions are the real access control).
    visible: list[str] = msgspec.field(default_factory=lambda: ["public", "internal"])


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    assets: Assets = msgspec.field(default_factory=Assets)
    limits: Limits = msgspec.field(default_factory=Limits)
    acceptance: Acceptance = msgspec.field(default_factory=Acceptance)
    validation: Validation = msgspec.field(default_factory=Validation)
    daemon: Daemon = msgspec.field(default_factory=Daemon)
    recovery: Recovery = msgspec.field(default_factory=Recovery)
    health: Health = msgspec.field(default_factory=Health)
    secrets: Secrets = msgspec.field(default_factory=Secrets)
    permissions: Permissions = msgspec.field(default_factory=Permissions)
    render: Render = msgspec.field(default_factory=Render)
    observe: Observe = msgspec.field(default_factory=Observe)
    filesystem: Filesystem = msgspec.field(default_factory=Filesystem)
    library: Library = msgspec.field(default_factory=Library)
    layers: Layers = msgspec.field(default_factory=Layers)
    #: ``[providers.<name>]`` tables (docs/generation.md): raw here, each checked
    #: into a ``ProviderConfig`` by :func:`parse` (read them via :attr:`provider_configs`).
    providers: dict[str, Any] = {}

    @property
    def provider_configs(self) -> dict[str, ProviderConfig]:
        """The hosted video providers generation jobs may name, by name."""
        return self.providers

    def asset_roots(self, spool_root: Path) -> list[Path]:
        """Asset roots as absolute, symlink-resolved folders."""
        return [(spool_root / r).resolve() for r in self.assets.roots]


def load(path: Path) -> Config:
    """Read and check ``spool.toml``; a missing file means all defaults."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot be read ({exc.strerror})") from None
    return parse(raw, str(path))


def parse(raw: bytes, name: str = "spool.toml") -> Config:
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(name, "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(name, f"is not valid TOML ({exc})") from None
    try:
        cfg = convert(data, Config)
    except InvalidInput as exc:
        raise ConfigError(f"{name}: {exc.field}", exc.problem) from None
    for key in ("temp_disk", "memory", "output_size"):
        try:
            parse_size(getattr(cfg.limits, key))
        except ValueError as exc:
            raise ConfigError(f"{name}: limits.{key}", str(exc)) from None
    # Imported here: the generate kind's settings build on this module's types.

    cfg.providers = parse_providers(data.get("providers"))
    # The variables holding provider tokens are secrets: masked wherever spool writes.
    cfg.secrets.env = sorted({*cfg.secrets.env, *secret_names(cfg.providers.values())})
    return cfg


def changed_keys(old: Config, new: Config) -> list[str]:
    """``section.key`` of every setting that differs between two configs."""
    out = []
    for section in Config.__struct_fields__:
        a, b = getattr(old, section), getattr(new, section)
        if not isinstance(a, msgspec.Struct):  # a table of tables ([providers.<name>])
            out += [f"{section}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            continue
        for key in type(a).__struct_fields__:
            if getattr(a, key) != getattr(b, key):
                out.append(f"{section}.{key}")
    return out


#: Settings a running daemon reads once, at start (a reload logs that they wait for a restart).
AT_START = ("daemon.watch", "filesystem.publish")


#: Seconds a changed ``spool.toml`` must keep one state before a loop applies it. An
#: editor that saves in place (nano, ``echo >``, vim with ``backupcopy``) truncates the
#: file and then writes it: a loop looking between the two would read an empty file as
#: every default (no asset roots: every drop rejected) until the next look.
SETTLE = 0.2


class Reloader:
    """Keeps a long-lived process's config in step with ``spool.toml``.

    :meth:`check` is cheap (one ``stat``) and is called every loop: a changed
    file is re-read and validated once it has kept one state for :data:`SETTLE`
    seconds (:meth:`settling` says when to look again); a file that no longer
    parses, or that was deleted, keeps the config in use and says so once (until
    it changes again). ``force`` (SIGHUP: the operator says the edit is done)
    re-reads at once, even an unchanged file.
    """

    def __init__(
        self, path: Path, cfg: Config, *, settle: float = SETTLE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.cfg = cfg
        self.settle = settle
        self._clock = clock
        self._sig = self._signature()
        self._told: object = self._sig  # the file state last reported on
        self._refused: object = None  # the file state last refused
        self._seen: object = self._sig  # the file state last looked at, and since when
        self._seen_at = clock()

    def settling(self) -> float | None:
        """Seconds until a change seen but not applied yet has settled (``None``: none)."""
        if self._seen == self._sig:
            return None
        return max(0.0, self._seen_at + self.settle - self._clock())

    def _signature(self) -> tuple[int, int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        except OSError:
            return self._sig if hasattr(self, "_sig") else None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def check(self, force: bool = False) -> tuple[Config | None, str | None]:
        """(the new config if it changed, one line for the log or ``None``)."""
        sig = self._signature()
        if sig == self._sig and not force:
            self._seen = sig  # back as it was (or never changed): nothing waits to settle
            return None, None
        now = self._clock()
        if sig != self._seen:
            self._seen, self._seen_at = sig, now
        if not force and now - self._seen_at < self.settle:
            return None, None  # maybe an editor between truncating and writing: look again
        self._sig = sig
        if sig is None:
            if self._told is None and not force:
                return None, None
            self._told = None
            return None, f"{self.path} is gone; keeping the configuration loaded before (restore the file)"
        try:
            new = parse(self.path.read_bytes(), str(self.path))
        except ConfigError as exc:
            # Said once per state of the file: a SIGHUP right after the loop noticed the
            # same broken file (the operator's edit, then systemctl reload) says nothing new.
            if sig == self._told and sig == self._refused:
                return None, None
            self._told = self._refused = sig
            return None, f"{exc}; keeping the configuration loaded before"
        except OSError as exc:
            self._told = sig
            return (
                None,
                f"{self.path} cannot be read ({exc.strerror}); keeping the configuration loaded before",
            )
        self._told = sig
        keys = changed_keys(self.cfg, new)
        self.cfg = new
        if not keys:
            return None, f"re-read {self.path}: nothing changed" if force else None
        later = [k for k in keys if k in AT_START]
        line = f"re-read {self.path}: changed {', '.join(keys)}"
        if later:
            line += f" ({', '.join(later)} take effect at the next start)"
        return new, line


def template(asset_roots: list[str], umask: str = "0022") -> str:
    """The commented ``spool.toml`` that ``spool init`` writes."""
    roots = ", ".join(f'"{_toml_escape(r)}"' for r in asset_roots)
    return f"""\
# spool.toml: operator configuration of this spool.
# Limits and policy come from here and never from a job. Every key is optional;
# the values below are the defaults. A bad value stops the daemon and the CLI
# with one error naming the key.

[assets]
# Folders that job sources may come from. A source must resolve (after symlinks)
# inside one of them. Relative entries are relative to this spool folder, and a
# relative source path in a submission is looked up under each root in order.
roots = [{roots}]

[limits]
max_active = 2          # renders one worker runs at once
temp_disk = "20GiB"     # disk a worker may reserve for renders in attempts/*/work
job_timeout = 3600      # seconds of wall-clock time one render may take
max_attempts = 3        # attempts per job before it fails for good
nice = 10               # CPU niceness of FFmpeg (0-19)
ionice = 7              # I/O priority of FFmpeg in the best-effort class (0 high - 7 low)
memory = 0              # address-space limit for FFmpeg, e.g. "8GiB"; 0 = none
output_size = 0         # largest output file FFmpeg may write, e.g. "50GiB"; 0 = none

[acceptance]
required_tags = ["campaign", "locale", "asset_type", "visibility"]
max_submission_bytes = 1048576
allow_noop = false         # accept "noop" jobs that do no media work (benchmarks and tests)

[validation]
decode_check = "sampled"   # full | sampled | none: how much of the output is decoded
duration_tolerance = 0.1   # seconds, when a job states none
sample_windows = 3         # sampled mode: windows decoded (start, middle, end)
sample_seconds = 0.5       # sampled mode: seconds decoded per window
measure_loudness = true    # record an output's integrated loudness (LUFS) with its metadata

[daemon]
poll_interval = 2.0        # seconds between directory rescans (network mounts rely on them)
heartbeat_interval = 5.0   # seconds between heartbeats in workers/<worker>.json
stop_grace = 30.0          # seconds running renders may finish after SIGTERM
watch = "auto"             # auto | inotify | poll; auto: spool doctor decides at daemon start
incoming_quiet = 2.0       # seconds a drop must stay unchanged when no inotify event shows it finished

[recovery]
stale_after = 120.0        # seconds without a heartbeat: suspect (other host), stalled (this host)
auto_recover = false       # take over suspect workers' jobs automatically (else: spool recover)
mount_lag = 60.0           # seconds another mount's changes may take to show here: a worker
                           # gone while writing through another mount waits this long for recovery
backoff = 10.0             # technical retries wait backoff * 2^(k-1) seconds...
backoff_max = 600.0        # ...at most this long
work_retention = 604800.0  # spool gc keeps finished attempts' work/ folders this many seconds

[health]
# A host-class failure (FFmpeg killed by a signal; an encoder, filter or font missing on
# this host; a local I/O error; a crash with no output) puts this worker on the job's
# blocklist (attempts/<job>/blocked-<worker>.json) and sends the job to another worker.
fail_after_workers = 2     # failing like that on this many different workers fails the job as its own
quarantine_after = 3       # this many host-class failures in a row: the worker stops claiming
                           # until an operator runs spool worker release W
self_check = true          # at start, render a tiny clip with every step kind and encoder first

[secrets]
# Values that must never reach logs, events, failure records or spool show.
# Environment variables named like *TOKEN*, *SECRET*, *PASSWORD*, *API_KEY* are
# always included; name others here, and token files kept outside the spool.
env = []
files = []

[permissions]
umask = "{umask}"           # every spool process applies it; "0002" for a spool a group shares

[render]
ffmpeg = "ffmpeg"
ffprobe = "ffprobe"
font_file = ""             # font for text steps; empty = fontconfig's default sans
threads = 0                # FFmpeg threads per render; 0 = FFmpeg's choice

[observe]
metrics_dir = "metrics"    # Prometheus textfiles spool-<worker>.prom; relative = inside the spool; "" = off
metrics_interval = 15.0    # seconds between rewrites of a worker's metrics file
bind = "127.0.0.1:8470"    # spool serve's default HOST:PORT
page_refresh = 5.0         # seconds between the status page's updates
thumbnail_width = 320      # poster-frame JPEG width made after publish (thumbs/); 0 = none

[filesystem]
# What the spool's filesystem can do decides two strategies; `spool doctor` shows
# what it measured and chose. Pin them here if you know better.
publish = "auto"           # auto | link | copy: hard-link outputs into store/, or copy + re-hash

[library]
# spool search lists only assets whose visibility tag is one of these (widen with
# --visibility). A discovery filter that fails closed, not access control:
# filesystem permissions on the spool are.
visible = ["public", "internal"]

[layers]
# Text and logos must sit inside the safe area, or the job is rejected at submit
# (docs/jobs.md, "Required layers"). A fraction kept centred (0.9 = 90 % title-safe) or a
# preset: title-safe, action-safe, social (picks social-9x16 / -4x5 / -1x1 / -16x9 by aspect).
safe_area = 0.9
"""


def _toml_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')
