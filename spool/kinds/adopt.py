"""The ``adopt`` kind: an existing media file published as it is, without re-rendering.

``spool library adopt`` (:mod:`spool.library.adopt`) makes one such job per file of a
folder; its version goes through the one publish path like a render's. The
contract, as the kind sees it:

* **freeze**: the file must resolve inside an asset root, be a regular media
  file ffprobe reads (no playlists), in a container spool publishes (its
  extension: ``.mp4``/``.m4v`` mp4, ``.mov`` mov, ``.webm`` webm; checked
  against the probe with the gate's own container rule); it is probed and
  hashed once, here;
* **produce**: the file is hard-linked into the attempt's ``work/`` (copied
  where the folder is on another filesystem), so the store links the same
  inode: adopted files become read-only (0444), as every store object is. An
  edit that replaces a file (what editors do) leaves the store intact; the
  next adoption publishes the new bytes as a new version;
* **check** (the gate): the candidate's sha256 must be the one accepted; the
  media record is what the acceptance probe measured of those very bytes
  (no decode check: the files are already in use, and adoption runs at the
  pace of one probe per file; ``spool verify`` re-hashes any version later);
* **pool** ``adopt``: no daemon sizes it, so only ``spool library adopt``
  runs adopt jobs; one left pending by an interrupted adoption waits for the
  next run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spool.core.errors import InvalidInput
from spool.core.model import Check, Expect, JobBase, Output, ValidationReport, media_info
from spool.disk import store
from spool.disk.tree import link_or_copy
from spool.kinds.base import Kind, Produced
from spool.media import sources as sources_
from spool.media.probe import ebml_doctype
from spool.media.validate import check_probe

if TYPE_CHECKING:
    from spool.core.config import Config
    from spool.core.submission import Submission
    from spool.disk.tree import Tree
    from spool.queue.attempt import Attempt
    from spool.queue.context import Context

#: File extensions adoption takes, and the container each is published as.
CONTAINERS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".webm": "webm"}
#: The pool adopt jobs draw from: sized by no daemon (see the module docstring).
POOL = "adopt"
#: The one source role of an adopt job.
ROLE = "media"


class AdoptJob(JobBase, tag="adopt"):
    """An adopt job file: the media file (``sources[0]``), probed and hashed at acceptance."""


class Adopt(Kind[AdoptJob]):
    name = "adopt"
    job_type = AdoptJob

    def pool(self, data: bytes) -> str:
        return POOL

    def freeze(self, tree: Tree, cfg: Config, sub: Submission, common: dict[str, Any]) -> AdoptJob:

        if set(sub.sources) != {ROLE}:
            raise InvalidInput("sources", f"an adopt job takes exactly one source, {ROLE!r}")
        path = sources_.resolve(ROLE, sub.sources[ROLE], cfg.asset_roots(tree.root))
        container = CONTAINERS.get(path.suffix.lower())
        if container is None:
            raise InvalidInput(
                f"sources.{ROLE}", f"{path.name} is not one of {', '.join(CONTAINERS)} (what spool publishes)"
            )
        src, info = sources_.inspect(ROLE, path, cfg)
        doctype = ebml_doctype(path) if container == "webm" else None
        found = check_probe(info, container, Expect(), cfg.validation.duration_tolerance, doctype)[0]
        if not found.ok:
            raise InvalidInput(f"sources.{ROLE}", f"{path} is not a {container} file (it is {found.actual})")
        out_file = sub.output.file or output_name(path.name)
        job = AdoptJob(
            **common,
            recipe_hash="",
            sources=[src],
            output=Output(file=out_file, container=container, expect=Expect()),
        )
        job.recipe_hash = self.spec_hash(job)
        return job

    def spec(self, job: AdoptJob) -> object:
        return {"media": job.sources[0].sha256, "file": job.output.file, "container": job.output.container}

    def produce(self, ctx: Context, job: AdoptJob, attempt: Attempt) -> Produced:
        started = time.monotonic()
        out = attempt.work / job.output.file
        # The same inode where the filesystem allows; else a copy verified against the
        # sha256 frozen at acceptance (and the gate hashes the candidate again).
        link_or_copy(Path(job.sources[0].path), out, job.sources[0].sha256)
        return Produced(out, round(time.monotonic() - started, 3))

    def check(self, cfg: Config, job: AdoptJob, candidate: Path, log: Path) -> ValidationReport:
        started = time.monotonic()
        src = job.sources[0]
        try:
            digest, size = store.sha256_file(candidate)
        except OSError as exc:
            digest, size = f"unreadable ({exc.strerror})", -1
        same = digest == src.sha256 and size == src.size
        checks = [
            Check(name="source", expected=f"sha256 {src.sha256}", actual=f"sha256 {digest}", ok=same),
            Check(
                name="probe",
                expected=f"a {job.output.container} file ffprobe reads",
                actual=f"{src.probe.format}, {src.probe.streams} stream(s)",
                ok=True,
            ),
        ]
        said = "the accepted bytes" if same else "CHANGED since acceptance"
        with open(log, "ab") as f:
            f.write(f"[adopt] {src.path}: {said}\n".encode())
        return ValidationReport(
            ok=same,
            decode_check="none",
            checks=checks,
            seconds=round(time.monotonic() - started, 3),
            media=media_info(src.probe, job.output.container) if same else None,
        )


def output_name(file_name: str) -> str:
    """A file name the output may have (``[A-Za-z0-9][A-Za-z0-9._-]*``, at most 128)."""
    stem, dot, ext = file_name.rpartition(".")
    if not dot:
        stem, ext = file_name, ""
    safe = "".join(c if (c.isascii() and (c.isalnum() or c in "._-")) else "-" for c in stem).strip("-._")
    safe = safe or "media"
    tail = f".{ext.lower()}" if ext else ""
    return safe[: 128 - len(tail)] + tail


KIND = Adopt()
