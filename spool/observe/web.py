"""``spool serve``: a read-only status page of one spool, and the JSON it is drawn from.

Routes (GET and HEAD; other methods get 405, other paths 404)::

    /                        the status page       /api/status            counts, running with
    /jobs/<job_id>           the job page                                 progress, attention, recent
    /static/app.js|app.css   the page's code                              outputs, workers
    /thumbs/<sha256>.jpg     a poster frame        /api/jobs/<job_id>     one job, with its timeline
    /download/<sha256>       a verified output     /api/library?t=TERM    library search (SPEC 9)

Every route that names a job, output or object shows only what ``[library]
visible`` admits (:mod:`spool.library.visibility`, SPEC 11 invariant 11): the rest is
left out of listings and answered 404 like something that does not exist.

Safe by construction, not by filtering:

* No URL path ever becomes a file path. After percent-decoding, a path must
  match one of the routes exactly, and the only names taken from it are a job
  ID (``[a-z0-9][a-z0-9._-]*@N``) or 64 hex digits: ``..``, ``%2e%2e``,
  slashes, backslashes and NULs cannot reach the filesystem.
* A thumbnail is opened with ``O_NOFOLLOW`` in a ``thumbs/`` folder that
  must itself resolve inside the spool, and must be a regular file: a symlink
  planted in ``thumbs/`` serves nothing.
* The page puts every value on screen with ``textContent`` (never
  ``innerHTML``), and a strict Content-Security-Policy (no inline script,
  same origin only, no framing) backs that up.
* The page never reloads itself. Its script fetches the JSON every
  ``page_refresh`` seconds, one request at a time (the next is scheduled
  when the last has finished), backs off exponentially when the server is
  away, and rests while the tab is hidden. The server computes the overview
  at most once a second for any number of viewers.

The server reads the spool and writes nothing to it, except the clock probe
of :func:`spool.disk.tree.server_now` (a hidden file created and removed in
``workers/``), which it skips when the spool is read-only for its user.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec

from spool.core.config import Config
from spool.core.errors import SpoolError
from spool.core.model import JOB_ID_RE
from spool.disk.tree import Tree
from spool.library import catalog, enrich, visibility
from spool.library.catalog import job_tags, resolve, visible_object
from spool.media import thumbs
from spool.observe import overview

log = logging.getLogger("spool.observe.web")

#: Recent outputs the status page shows.
RECENT = 12
#: Most library results one page request returns.
LIBRARY_LIMIT = 60
#: Seconds an overview is reused for every viewer.
CACHE_SECONDS = 1.0

_THUMB = re.compile(r"^/thumbs/([0-9a-f]{64})\.jpg$")
_DOWNLOAD = re.compile(r"^/download/([0-9a-f]{64})$")
_JOB_PAGE = re.compile(r"^/jobs/([^/]+)$")
_JOB_API = re.compile(r"^/api/jobs/([^/]+)$")
_STATIC = {"/static/app.js": ("app.js", "text/javascript"), "/static/app.css": ("app.css", "text/css")}

_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}


#: The page's HTML, script and style (package data).
ASSETS = Path(__file__).with_name("web_assets")


def _asset(name: str) -> bytes:
    return (ASSETS / name).read_bytes()


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port)."""
    m = re.match(r"^(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]*)):(\d{1,5})$", text.strip())
    if not m or int(m.group(3)) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (for example 127.0.0.1:8470 or [::1]:8470)")
    return (m.group(1) or m.group(2) or "127.0.0.1"), int(m.group(3))


class StatusSource:
    """What the page shows, computed at most once per ``CACHE_SECONDS`` for all viewers.

    Every job, output and object the page names passes :mod:`spool.library.visibility`'s
    rule of ``[library] visible`` (never widened here): invisible ones are left out
    of every listing and answered 404, as unknown ones are."""

    def __init__(self, tree: Tree, cfg: Config) -> None:
        self.tree = tree
        self.cfg = cfg
        self.rule = visibility.rule(cfg)
        self._lock = threading.Lock()
        self._at = -1e9
        self._body = b""
        #: job ID -> visible; a job's tags never change, so neither does the answer
        self._seen: dict[str, bool] = {}

    def visible(self, job_id: str) -> bool:
        """Whether the rule admits the job (its tags are read once per server)."""
        known = self._seen.get(job_id)
        if known is not None:
            return known

        tags = job_tags(self.tree, job_id)
        ok = self.rule.admits(tags)
        if tags is not None:  # an unknown job may appear later: not remembered
            if len(self._seen) > 100_000:
                self._seen.clear()
            self._seen[job_id] = ok
        return ok

    def status(self) -> bytes:
        with self._lock:
            if time.monotonic() - self._at >= CACHE_SECONDS:
                ov = overview.overview(self.tree, self.cfg, recent=RECENT)
                ov["refresh_seconds"] = self.cfg.observe.page_refresh
                self._body = msgspec.json.encode(self._only_visible(ov))
                self._at = time.monotonic()
            return self._body

    def _only_visible(self, ov: dict[str, Any]) -> dict[str, Any]:
        """The overview without a row that names an invisible job (counts stay: a
        number names nothing). Rejected submissions are not jobs and stay listed."""
        for key in ("running", "failed", "recent"):
            ov[key] = [r for r in ov[key] if self.visible(r["job_id"])]
        ov["attention"] = [a for a in ov["attention"] if a["kind"] != "failed" or self.visible(a["subject"])]
        return ov

    def job(self, job_id: str) -> bytes | None:
        if not self.visible(job_id):
            return self._campaign(job_id)
        info = overview.job_detail(self.tree, job_id)
        if info is None:
            return None
        info["refresh_seconds"] = self.cfg.observe.page_refresh
        return msgspec.json.encode(info)

    def _campaign(self, parent: str) -> bytes | None:
        """A fan-out's parent (it has no tags of its own): its grid of variants, each only if
        visible; a parent none of whose variants is visible answers as an unknown job."""
        info = overview.fanout_detail(self.tree, parent)
        if info is None:
            return None
        rows = [r for r in info["variants"] if self.visible(r["job"])]
        if not rows:
            return None
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        info |= {"variants": rows, "counts": counts}
        info["refresh_seconds"] = self.cfg.observe.page_refresh
        return msgspec.json.encode(info)

    def library(self, query: str) -> tuple[HTTPStatus, bytes]:
        """``/api/library?t=TERM&t=TERM``: current versions, visibility as configured
        (the page cannot widen it), at most :data:`LIBRARY_LIMIT` results."""

        terms = parse_qs(query, keep_blank_values=False).get("t", [])
        try:
            q = catalog.parse_terms(terms, enrich.plugins())
            res = catalog.search(self.tree, self.cfg, q, limit=LIBRARY_LIMIT, rule=self.rule)
        except SpoolError as exc:
            return HTTPStatus.BAD_REQUEST, msgspec.json.encode({"error": str(exc)})
        return HTTPStatus.OK, msgspec.json.encode(res)

    def thumbnail(self, digest: str) -> bytes | None:
        """The JPEG bytes of ``thumbs/<digest>.jpg``, or ``None`` unless it is a
        regular file, reached without following a symlink, inside the spool, of an
        object a visible job publishes."""
        if visible_object(self.tree, self.rule, digest) is None:
            return None
        folder = thumbs.folder(self.tree)
        try:
            real = folder.resolve(strict=True)
            real.relative_to(self.tree.root.resolve(strict=True))
        except (OSError, ValueError):
            return None
        try:
            dir_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            fd = os.open(f"{digest}.jpg", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                log.warning("refused thumbs/%s.jpg: it is a symlink", digest)
            return None
        finally:
            os.close(dir_fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > 16 << 20:
                return None
            with os.fdopen(fd, "rb") as f:
                fd = -1
                return f.read()
        finally:
            if fd >= 0:
                os.close(fd)


class Handler(BaseHTTPRequestHandler):
    server_version = "spool"
    protocol_version = "HTTP/1.1"
    timeout = 30  # a slow or idle client cannot hold a thread for long
    source: StatusSource  # set on the subclass made by make_server
    page: bytes
    query: str = ""

    def version_string(self) -> str:
        return self.server_version

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only\n", "text/plain", extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def _route(self, head: bool) -> None:
        raw = urlsplit(self.path).path
        self.query = urlsplit(self.path).query
        if (m := _DOWNLOAD.match(raw)) is not None:
            return self._download(m.group(1), head)
        try:
            status, body, ctype, extra = self._resolve(unquote(raw, errors="strict"))
        except UnicodeDecodeError:
            status, body, ctype, extra = HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", {}
        except Exception:
            log.exception("GET %s failed", raw)
            status, body, ctype, extra = HTTPStatus.INTERNAL_SERVER_ERROR, b"error\n", "text/plain", {}
        self._send(status, body, ctype, head=head, extra=extra)

    def _resolve(self, path: str) -> tuple[HTTPStatus, bytes, str, dict[str, str]]:
        src = self.source
        no_store = {"Cache-Control": "no-store"}
        if path == "/" or ((m := _JOB_PAGE.match(path)) and JOB_ID_RE.match(m.group(1))):
            return HTTPStatus.OK, self.page, "text/html; charset=utf-8", no_store
        if path in _STATIC:
            name, ctype = _STATIC[path]
            return HTTPStatus.OK, _asset(name), f"{ctype}; charset=utf-8", {"Cache-Control": "no-cache"}
        if path == "/api/status":
            return HTTPStatus.OK, src.status(), "application/json", no_store
        if (m := _JOB_API.match(path)) and JOB_ID_RE.match(m.group(1)):
            body = src.job(m.group(1))
            if body is None:
                return HTTPStatus.NOT_FOUND, b'{"error":"no such job"}', "application/json", no_store
            return HTTPStatus.OK, body, "application/json", no_store
        if path == "/api/library":
            code, body = src.library(self.query)
            return code, body, "application/json", no_store
        if m := _THUMB.match(path):
            img = src.thumbnail(m.group(1))
            if img is not None:
                return HTTPStatus.OK, img, "image/jpeg", {"Cache-Control": "max-age=86400, immutable"}
        return HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", {}

    def _download(self, digest: str, head: bool) -> None:
        """Stream a store object after re-hashing it (the ``spool get`` promise)."""

        try:
            got = resolve(self.source.tree, digest, self.source.rule)
            size = got.path.stat().st_size
            f = open(got.path, "rb")  # noqa: SIM115 - closed below
        except (SpoolError, OSError):
            return self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
        with f:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.send_header("Content-Disposition", f'attachment; filename="{got.file}"')
            for k, v in _SECURITY_HEADERS.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                shutil.copyfileobj(f, self.wfile, 1 << 20)

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        ctype: str,
        *,
        head: bool = False,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in {**_SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Server6(Server):
    address_family = socket.AF_INET6


def make_server(tree: Tree, cfg: Config, host: str, port: int) -> Server:
    """A server bound to ``host:port`` (port 0: any free port); call ``serve_forever``."""
    handler = type(
        "SpoolHandler",
        (Handler,),
        {"source": StatusSource(tree, cfg), "page": _asset("index.html")},
    )
    cls = Server6 if ":" in host else Server
    return cls((host, port), handler)


def url_of(server: Server) -> str:
    host, port = str(server.server_address[0]), server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def serve(tree: Tree, cfg: Config, host: str, port: int, ready: Callable[[str], None]) -> None:
    """Serve until interrupted; ``ready`` gets the URL once the socket listens."""
    server = make_server(tree, cfg, host, port)
    try:
        ready(url_of(server))
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
