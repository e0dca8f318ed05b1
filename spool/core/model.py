"""Typed records for every file spool writes (SPEC sections 1-6).

Each record is a ``msgspec.Struct``; :func:`encode` and :func:`decode` are the
only way records become bytes and back. Records that spool writes tolerate
unknown fields when read (a newer spool may add some); what users write (the
submission) is strict and lives in :mod:`spool.queue.accept`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import msgspec

T = TypeVar("T")

#: ``<name>@<revision>``
JOB_ID_RE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._-]{0,95})@(?P<rev>[1-9][0-9]{0,8})$")

#: Version of the on-disk job format; bumped only for incompatible changes.
FORMAT = 1

State = Literal["waiting", "pending", "held", "running", "complete", "failed"]


def now() -> datetime:
    return datetime.now(UTC)


def job_id(name: str, revision: int) -> str:
    return f"{name}@{revision}"


class Record(msgspec.Struct, kw_only=True):
    """Base of every on-disk record."""


# -- sources -----------------------------------------------------------------


class VideoInfo(Record, kw_only=True):
    codec: str
    width: int
    height: int
    fps: float
    pix_fmt: str | None = None


class AudioInfo(Record, kw_only=True):
    codec: str
    channels: int
    sample_rate: int


class ProbeSummary(Record, kw_only=True):
    """The few probe facts a recipe or a human needs, not the whole ffprobe dump."""

    format: str
    duration: float | None
    still: bool  # a single image (logo), not a moving clip
    video: VideoInfo | None = None
    audio: AudioInfo | None = None
    streams: int = 0


class Source(Record, kw_only=True):
    """One input as accepted: it must still hash to ``sha256`` when rendered."""

    role: str
    path: str
    size: int
    sha256: str
    probe: ProbeSummary


class Upstream(Record, kw_only=True):
    """A source taken from another job's published output (SPEC 11.12, :mod:`spool.queue.depends`).

    ``ref`` is what the submission said: ``mug-gen`` (the newest revision of that
    name), ``mug-gen@2`` (that revision) or ``asset:<query>`` (a library query that
    named one asset at acceptance). ``job`` and ``sha256`` are set when the source is
    frozen to the upstream's exact store object; until then the job waits in
    ``waiting/``."""

    role: str
    ref: str
    job: str | None = None
    sha256: str | None = None


class HoldRecord(Record, kw_only=True):
    """``deps/_held/<job>.json``: why a dependent was moved to ``held/`` (spool.queue.depends):
    its upstream failed, was cancelled, superseded or is gone, or cannot be used."""

    job_id: str
    upstream: str
    cause: str
    reason: str
    next_action: str
    at: datetime
    by: str


# -- the job -----------------------------------------------------------------


class Expect(Record, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Machine-checkable expectations of the output; ``None`` means unchecked.

    A submission may state any of them; the rest default from the recipe.
    """

    video_streams: int | None = None
    audio_streams: int | None = None
    subtitle_streams: int | None = None
    video_codec: str | None = None
    audio_codec: str | None = None
    width: int | None = None
    height: int | None = None
    fps: float | None = None
    pix_fmt: str | None = None
    duration: float | None = None
    duration_tolerance: float | None = None


class Output(Record, kw_only=True):
    file: str
    container: str
    expect: Expect
    #: What the submitter stated (the rest of ``expect`` came from the recipe):
    #: a revision keeps these and re-derives the others from its new recipe.
    stated: Expect = msgspec.field(default_factory=Expect)


class JobBase(Record, kw_only=True, tag_field="operation"):
    """The frozen job file: written once at acceptance, never changed.

    What every kind of job has. Each kind (:mod:`spool.kinds`) subclasses it
    with its own spec and tag, so a job file is a tagged union on
    ``"operation"`` (``render``, ``noop``, ...): :data:`spool.kinds.Job` is
    that union, and ``spool.kinds.decode_job`` reads any of them.
    """

    format: int = FORMAT
    job_id: str
    name: str
    revision: int
    supersedes: str | None = None
    #: sha256 of the canonical JSON of the kind's spec (the recipe for a render):
    #: checked again at claim, so an edited job file is never run.
    recipe_hash: str
    sources: list[Source]
    output: Output
    tags: dict[str, str]
    priority: int = 0
    submitted_at: datetime
    submitted_by: str
    submission_sha256: str = ""  # of the submitted bytes: recognises a re-delivered drop
    estimate_bytes: int = 0  # temporary disk the render may need (reserved before claiming)
    #: Sources taken from other jobs (:mod:`spool.queue.depends`): unresolved while the job
    #: waits in ``waiting/``, each pinned to a store object once it is frozen.
    upstreams: list[Upstream] = []
    #: A waiting job's submission, frozen again by its kind once every upstream has
    #: published; ``None`` once frozen (and for every job without upstreams).
    request: dict[str, Any] | None = None
    #: A variant of a fan-out (:mod:`spool.queue.fanout`): the parent's ID and this variant's values.
    parent: str | None = None
    variant: dict[str, str] = {}

    @property
    def operation(self) -> str:
        """The kind's name: the tag this job file carries."""
        return str(self.__struct_config__.tag)

    @property
    def resolved(self) -> bool:
        """Whether every source is frozen (no upstream still to publish)."""
        return all(u.sha256 is not None for u in self.upstreams)

    def source(self, role: str) -> Source:
        for s in self.sources:
            if s.role == role:
                return s
        raise KeyError(role)


# -- attempts ----------------------------------------------------------------


class AttemptRecord(Record, kw_only=True):
    """``attempts/J/<n>/attempt.json``: who owns this attempt, written at claim.

    Format 2 (:mod:`spool.disk.formats`) writes it again at the end of an attempt that
    produced a result, with that result staged in ``result`` (format 1's
    ``result.json``); neither write is fsynced for a slot kind's attempt: the
    manifest, which carries the attempt's identity, is the durable record of an
    attempt that published, and ``failure.json``/``interrupted.json`` of one that
    ended otherwise."""

    job_id: str
    n: int
    worker: str
    host: str
    pid: int
    boot_id: str
    claimed_at: datetime
    reason: str = "claim"
    #: Format 2: the manifest this attempt staged (``None`` until it produced a result).
    result: Manifest | None = None
    #: Written again by ``spool fsck`` after a power cut emptied it (format 2 does not
    #: fsync a slot attempt's record): who and when come from what the tree proves.
    rewritten: str = ""


class Interruption(Record, kw_only=True):
    """``attempts/J/<n>/interrupted.json``: the attempt was stopped before it ended
    (a graceful stop, ownership lost at a fence, or deferred: it waited for a
    provider's quota or spending allowance and did nothing that counts)."""

    job_id: str
    attempt: int
    reason: str
    worker: str
    at: datetime
    #: Deferred: the attempt made no create and does not count against ``max_attempts``.
    deferred: bool = False


class Delay(Record, kw_only=True):
    """``attempts/J/delay.json``: a retry waits; the job is not claimed before then."""

    job_id: str
    not_before: datetime
    after_attempt: int
    reason: str


class RetryMark(Record, kw_only=True):
    """``attempts/J/retry-<n>.json``: an operator sent the job back after attempt n."""

    job_id: str
    after_attempt: int
    by: str
    at: datetime


class CancelRequest(Record, kw_only=True):
    """``attempts/J/cancel.json``: stop this job; its worker acts on it."""

    job_id: str
    by: str
    reason: str
    at: datetime


class Approval(Record, kw_only=True):
    """``approvals/J/<sha256>.<by>.json``: someone approved this exact output."""

    job_id: str
    sha256: str
    store_path: str
    by: str
    note: str = ""
    at: datetime


class Progress(Record, kw_only=True):
    """``progress.json``: a hint for humans, rewritten while FFmpeg runs."""

    percent: float | None
    frame: int
    fps: float | None
    speed: float | None
    out_time: float
    eta_seconds: float | None
    updated_at: datetime
    done: bool = False


class Check(Record, kw_only=True):
    """One validation check: what was expected, what the file has."""

    name: str
    expected: Any
    actual: Any
    ok: bool


class LayerBox(Record, kw_only=True, omit_defaults=True):
    """Where one ``text`` or ``overlay`` step lands in the output frame (spool.kinds.render.layers):
    planned at acceptance (``RenderJob.layers``, which the render draws exactly) and
    judged again by the gate (``ValidationReport.layers``). Boxes are x, y, w, h
    in output pixels; ``at`` is the x, y the filter is given."""

    step: int
    op: str
    box: list[int]
    safe_area: str
    safe: list[int]
    at: list[int]
    size: int | None = None  # text: the font size drawn (after "fit")
    text: str | None = None  # text: the characters drawn (after "wrap")
    font_file: str | None = None  # text: the font file fontconfig resolved at acceptance
    font_sha256: str | None = None  # text: that file's sha256; a render on a host with another fails
    verdict: str = "inside"


class MediaInfo(Record, kw_only=True):
    """What the validation gate measured of the verified output (the first video and
    audio streams): kept in the manifest's report and in the version record at
    publish, so ``spool search`` filters on it at once. ``None``: not measured or not
    there (no audio stream, a still image's duration, loudness the gate did not
    measure)."""

    container: str  # as published and checked by the gate: mp4, mov, webm
    video_codec: str | None = None
    audio_codec: str | None = None
    width: int | None = None
    height: int | None = None
    fps: float | None = None
    duration: float | None = None  # seconds
    pix_fmt: str | None = None
    audio_channels: int | None = None
    loudness: float | None = None  # integrated, LUFS (EBU R128), when the gate measured it


def media_info(summary: ProbeSummary, container: str, loudness: float | None = None) -> MediaInfo:
    """Pure: the media record of a probe summary of a file published as ``container``."""
    v, a = summary.video, summary.audio
    return MediaInfo(
        container=container,
        video_codec=v.codec if v else None,
        audio_codec=a.codec if a else None,
        width=v.width or None if v else None,
        height=v.height or None if v else None,
        fps=v.fps or None if v else None,
        duration=summary.duration,
        pix_fmt=v.pix_fmt if v else None,
        audio_channels=a.channels or None if a else None,
        loudness=loudness,
    )


class ValidationReport(Record, kw_only=True):
    ok: bool
    decode_check: str
    checks: list[Check]
    seconds: float
    layers: list[LayerBox] | None = None  # every text/overlay layer with its box and verdict
    #: What the gate measured of the file (media outputs only; a noop's text file has none).
    media: MediaInfo | None = None

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


#: Where an attempt failed. ``produce`` is any kind's making of its candidate (an
#: unexpected error); ``submit``, ``generate`` and ``retrieve`` are a generation's
#: steps (its create, the provider's work, the download).
Stage = Literal[
    "prepare",
    "render",
    "produce",
    "submit",
    "generate",
    "retrieve",
    "validate",
    "publish",
    "commit",
    "recover",
    "cancel",
]


class Failure(Record, kw_only=True):
    """``attempts/J/<n>/failure.json``: a located error and what to do next."""

    job_id: str
    attempt: int
    stage: Stage
    property: str
    expected: Any = None
    actual: Any = None
    message: str
    log_excerpt: list[str] = []
    next_action: str
    worker: str
    failed_at: datetime
    retryable: bool = False
    #: ``job``: the job's own fault (its recipe, sources, expectations); ``host``: what
    #: the worker's host lacks or did (FFmpeg killed, an encoder or font missing, local
    #: I/O): the job moves on to another worker (:mod:`spool.queue.blocklist`).
    fault: Literal["job", "host"] = "job"
    host: str = ""


class PublishedFile(Record, kw_only=True):
    file: str
    sha256: str
    size: int
    container: str
    store_path: str  # relative to the spool root
    method: Literal["link", "copy", "existing"]


class SourceDigest(Record, kw_only=True):
    role: str
    sha256: str


class VersionEntry(Record, kw_only=True):
    """``library/<name>/<revision>`` (format 1): one published revision of an asset; a
    format 2 segment's line is one too, with the job's indexed tags."""

    job_id: str
    name: str
    revision: int
    sha256: str
    store_path: str
    published_at: datetime
    indexed_at: datetime
    #: What the gate measured of the output (the manifest's ``validation.media``).
    media: MediaInfo | None = None


class Manifest(Record, kw_only=True):
    """``manifests/J.json`` (and the attempt's staged result): the published output.

    It names the attempt that published it with that attempt's identity (worker,
    host, pid, boot id, claim time): in a format 2 tree it is the durable record of
    that attempt (SPEC 11.9)."""

    job_id: str
    attempt: int
    recipe_hash: str
    output: PublishedFile
    sources: list[SourceDigest]
    validation: ValidationReport
    tags: dict[str, str]
    worker: str
    claimed_at: datetime
    render_seconds: float
    validate_seconds: float
    published_at: datetime
    note: str = ""
    host: str = ""
    pid: int = 0
    boot_id: str = ""


# -- recovery ------------------------------------------------------------------

#: What recovery decided about a job whose worker stopped (:func:`spool.repair.recover.decide`).
Decision = Literal[
    "published",
    "staged",
    "recorded-failure",
    "recorded-interruption",
    "accept-candidate",
    "retry",
    "exhausted",
]


class Evidence(Record, kw_only=True):
    """What recovery saw, recorded with its decision."""

    job_id: str
    worker: str
    attempt: int  # the attempt of the current claim; 0 if the claim made none
    attempts_used: int
    manifest: str  # "absent", "verified" or why it is not
    result: str
    failure: str  # "absent", "final" or "retryable"
    interrupted: bool
    candidate: str  # "absent", or the candidate's path relative to the spool


class RecoveryRecord(Record, kw_only=True):
    """``attempts/J/recovery-<n>.json``: one recovery decision with its evidence."""

    job_id: str
    decision: Decision
    reason: str
    evidence: Evidence
    worker_state: str = ""  # why the recoverer was allowed to act
    validation: ValidationReport | None = None
    decided_by: str
    decided_at: datetime


# -- workers, events, rejections -----------------------------------------------


class PoolUse(Record, kw_only=True):
    """How much of one resource pool a daemon uses (kinds draw from pools)."""

    capacity: int
    active: int
    #: When the pool's gate is closed (a provider's quota, its spending allowance): until
    #: when (epoch seconds; ``None``: unknown) and why. Its jobs wait in ``pending/``.
    waiting_until: float | None = None
    waiting_reason: str | None = None


class WorkerRecord(Record, kw_only=True):
    """``workers/<worker>.json``: identity and heartbeat of one daemon."""

    worker: str
    host: str
    pid: int
    boot_id: str
    started_at: datetime
    heartbeat_at: datetime
    beats: int
    state: Literal["running", "stopping", "stopped", "disk_full"] = "running"
    max_active: int
    active: list[str] = []
    temp_disk_reserved: int = 0
    temp_disk_limit: int = 0
    #: Use of each resource pool this daemon draws from (``render``: FFmpeg slots).
    pools: dict[str, PoolUse] = {}
    #: Why this worker stopped claiming (host quarantine), if it did.
    quarantined: str | None = None
    #: When the longest-waiting job this daemon's index holds was submitted (epoch
    #: seconds): status reads it instead of stat-ing 100,000 pending files.
    oldest_pending_submitted: float | None = None
    version: str = ""
    #: The device number (``st_dev``) of the spool folder as this worker saw it. On one
    #: host, another number is another mount: another client cache, which may show this
    #: worker's writes late (0: not recorded, by a daemon older than this field).
    device: int = 0
    #: A walk of ``attempts/`` for leftovers of this host's dead writers is owed: a process of
    #: this worker died, and no walk has finished since (:func:`spool.queue.workers.walk_owed`).
    leftovers_owed: bool = False


class Event(Record, kw_only=True, omit_defaults=True):
    """One line of the transition journal in ``events/``."""

    ts: datetime
    job: str
    to: str
    from_: str | None = msgspec.field(default=None, name="from")
    attempt: int | None = None
    worker: str | None = None
    reason: str | None = None
    #: Structured facts for scripts and metrics (omitted when not relevant):
    stage: str | None = None  # failed: where
    property: str | None = None  # failed: what (a validation check's name, ...)
    bytes: int | None = None  # complete: size of the published output
    render_seconds: float | None = None
    validate_seconds: float | None = None
    #: A line ``spool fsck`` wrote from the tree because the original was lost in a crash.
    rebuilt: bool | None = None


class BlockEntry(Record, kw_only=True):
    """``attempts/J/blocked-<worker>.json``: this worker failed the job with a
    host-class error and must not claim it again; its evidence."""

    job_id: str
    worker: str
    host: str
    attempt: int
    property: str
    message: str
    log_excerpt: list[str] = []
    at: datetime


class WorkerQuarantine(Record, kw_only=True):
    """``workers/<worker>.quarantined``: the worker stopped claiming; an operator
    lifts it with ``spool worker release W`` after fixing the host."""

    worker: str
    host: str
    reason: str
    evidence: list[str] = []  # the failures (or the self-check step) that led here
    since: datetime


class QuarantineRecord(Record, kw_only=True):
    """``quarantine/<file>.reason``: why a file in the queue can never be run."""

    file: str  # its name in quarantine/ (as it was in the state folder)
    found_in: str  # the folder it was taken from: pending, held, running/<worker>
    field: str  # what is wrong: "job", "recipe_hash", "job_id", ...
    reason: str
    by: str  # the worker or command that moved it
    at: datetime


class Rejection(Record, kw_only=True):
    """``rejected/<name>.error.json``: why a submission never became a job."""

    file: str
    field: str
    reason: str
    rejected_at: datetime
    rejected_by: str


# -- bytes ---------------------------------------------------------------------

_encoder = msgspec.json.Encoder(order="deterministic")


def encode(record: Any) -> bytes:
    """A record as pretty, stable JSON: humans read these files with ``cat``."""
    return msgspec.json.format(_encoder.encode(record), indent=2) + b"\n"


def encode_line(record: Any) -> bytes:
    """A record as one compact JSON line (events)."""
    return _encoder.encode(record) + b"\n"


def decode(data: bytes, typ: type[T]) -> T:
    return msgspec.json.decode(data, type=typ)


def canonical_json(value: Any) -> bytes:
    """Canonical JSON (sorted keys, no whitespace, UTF-8): the input of recipe_hash."""
    return msgspec.json.encode(msgspec.to_builtins(value), order="sorted")
