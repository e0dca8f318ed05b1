#!/usr/bin/env python3
"""provsim: a hosted video model on 127.0.0.1 that speaks Replicate's and Runway's APIs.

It "generates" real MP4s with FFmpeg (lavfi colour + the prompt drawn with
drawtext, so every output differs; 1 s 320x180 by default, rendered on the
first download) and injects faults on request, so spool's generation path can
be tested, tortured, benchmarked and demonstrated without a network or a token.

Protocols (the shapes of the public APIs):

* Replicate: ``POST /v1/models/{owner}/{name}/predictions``, ``POST
  /v1/predictions`` (``version``), ``GET /v1/predictions/{id}``, ``POST
  /v1/predictions/{id}/cancel``, ``GET /v1/predictions`` (newest first, cursor
  pages of ``page_size``); ``Authorization: Bearer``.
* Runway: ``POST /v1/image_to_video`` / ``/v1/text_to_video`` -> ``{"id"}``,
  ``GET /v1/tasks/{id}``, ``DELETE /v1/tasks/{id}``; ``X-Runway-Version``
  required.
* Outputs: ``GET /files/{id}.mp4?exp=<unix>&sig=<hmac>`` with
  ``Content-Length`` and ``Content-Digest: sha-256=:<b64>:``.

Faults, per job: words ``#fault=<name>[:<arg>]`` in the input's ``prompt``
(or ``promptText``), or a ``"sim_faults"`` list in the input; for every new
job: ``POST /_sim/control {"faults": [...]}``. Names:

======================  ===========================================================
``create_5xx``          the create answers 503 and makes nothing
``create_5xx_after``    the create makes the job, then answers 502 (ambiguous)
``create_timeout:S``    the create makes the job, then stalls S seconds (ambiguous)
``retention:S``         the job is shown without its input and output once it is S
                        seconds old, as Replicate's retention does (``retention:0``: from
                        the start)
``get_5xx:N``           the first N polls answer 500
``ratelimit:N:S``       the first N polls answer 429 with ``Retry-After: S``
``slow:S``              every poll of the job takes S seconds
``work:S``              the job takes S seconds to finish (default: server's ``work``)
``never``               the job never finishes
``weird_status``        the job reports a status the API does not document (``queued``,
                        ``QUEUED``) until it finishes
``throttled:S``         Runway: the task is ``THROTTLED`` for S seconds before it starts
                        (its work time counts from then)
``fail``                the job fails with an error message
``output_object``       the output is ``{"video": url}`` (Replicate models may return any JSON)
``output_empty``        the output is ``[]``
``truncate``            downloads send half the body, then close the connection
``trickle:B:S``         downloads send B bytes every S seconds
``file_401:N``          the first N downloads answer 401
``bad_checksum``        downloads state a Content-Digest of other bytes
``not_video``           the output is text, not an MP4
``duplicate``           the create makes a second, identical job (listing finds two)
``recomplete``          a finished job reports completion again on every poll, with a new output URL
``late:S``              a cancelled job still succeeds S seconds later
``expire:S``            output URLs expire S seconds after they are handed out (Replicate: after
                        success, the same URL every time; Runway: each GET signs a fresh one)
``gzip``                downloads come gzip-encoded (with a ``Repr-Digest`` of the video)
``lose:N``              after N polls the provider forgets the job (404)
======================  ===========================================================

Provider-wide: ``POST /_sim/control`` with ``{"ratelimit": {"count": N,
"retry_after": S}}`` (the next N API requests answer 429), ``{"down": N}``
(the next N answer 503), ``{"create_429": {"count": N, "retry_after": S,
"ms": false}}`` (the next N creates answer 429: Runway's daily quota; ``ms``
states it as ``retry-after-ms``), ``{"list_fail": N}`` (the next N listings
answer 500; -1: all of them); ``GET /_sim/stats`` counts requests by operation
(``create`` counts every create request received, faulted or not;
``deleted_succeeded`` counts DELETEs of finished Runway tasks: a lost paid
result); ``POST /_sim/reset`` forgets everything. Every create request is also
logged with its time and input (:attr:`SimState.create_log`), so a test can
tell which attempt sent it.

Run standalone: ``python tools/provsim.py --port 8471 --token simtoken-123``;
in-process: ``with ProviderSim(token=...) as sim: sim.url``.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_FAULT = re.compile(r"#fault=([a-z0-9_]+(?::[0-9.]+)*)")
_SECRET = b"provsim-url-signing"


def parse_faults(input: dict[str, Any]) -> dict[str, list[float]]:
    """``{"prompt": "x #fault=ratelimit:2:1"}`` -> ``{"ratelimit": [2.0, 1.0]}``."""
    words: list[str] = []
    for key in ("prompt", "promptText"):
        if isinstance(input.get(key), str):
            words += _FAULT.findall(input[key])
    if isinstance(input.get("sim_faults"), list):
        words += [str(w) for w in input["sim_faults"]]
    out: dict[str, list[float]] = {}
    for w in words:
        name, *args = w.split(":")
        out[name] = [float(a) for a in args]
    return out


@dataclass
class SimJob:
    id: str
    protocol: str  # "replicate" | "runway"
    model: str
    version: str | None
    input: dict[str, Any]
    faults: dict[str, list[float]]
    created: float
    work: float
    polls: int = 0
    canceled_at: float | None = None
    succeeded_at: float | None = None
    hidden: bool = False  # a duplicate nobody was told about
    deleted: bool = False  # Runway: DELETE of a finished task removes it
    downloads: int = 0

    def arg(self, name: str, i: int = 0, default: float = 0.0) -> float:
        args = self.faults.get(name, [])
        return args[i] if len(args) > i else default

    def started(self) -> float:
        """When the job's work began (after a Runway THROTTLED spell)."""
        return self.created + self.arg("throttled", 0, 0.0) if "throttled" in self.faults else self.created

    def status(self, now: float) -> str:
        """Normalised status now: throttled, queued, running, succeeded, failed, canceled."""
        if self.canceled_at is not None:
            late = self.faults.get("late")
            if late is not None and now >= self.canceled_at + self.arg("late", 0, 1.0):
                self.succeeded_at = self.succeeded_at or now
                return "succeeded"
            return "canceled"
        if "throttled" in self.faults and now < self.started():
            return "throttled"
        began = self.started()
        if "never" in self.faults:
            return "running" if now - began > 0.05 else "queued"
        if now - began >= self.work:
            if "fail" in self.faults:
                return "failed"
            self.succeeded_at = self.succeeded_at or now
            return "succeeded"
        return "running" if now - began > min(0.05, self.work / 2) else "queued"


_REPLICATE = {
    "throttled": "starting",
    "queued": "starting",
    "running": "processing",
    "succeeded": "succeeded",
    "failed": "failed",
    "canceled": "canceled",
}
_RUNWAY = {
    "throttled": "THROTTLED",
    "queued": "PENDING",
    "running": "RUNNING",
    "succeeded": "SUCCEEDED",
    "failed": "FAILED",
    "canceled": "CANCELLED",
}


@dataclass
class SimState:
    token: str
    work: float
    page_size: int
    files: Path
    jobs: dict[str, SimJob] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    faults_for_new: list[str] = field(default_factory=list)
    ratelimit: int = 0
    ratelimit_after: float = 1.0
    down: int = 0
    create_429: int = 0
    create_429_after: float = 1.0
    create_429_ms: bool = False
    list_fail: int = 0
    #: (time received, input) of every create request, faulted or not.
    create_log: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    render_locks: dict[str, threading.Lock] = field(default_factory=dict)


def render_mp4(dest: Path, text: str, width: int = 320, height: int = 180, duration: float = 1.0) -> None:
    """A real, small H.264 MP4 with ``text`` drawn on it (read from a file: no escaping)."""
    tf = dest.with_suffix(".txt")
    tf.write_text(text[:120] or " ")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp.mp4")
    cmd = [
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
        "-f", "lavfi", "-i", f"color=c=0x203040:s={width}x{height}:d={duration}:r=24",
        "-vf", f"drawtext=textfile={tf}:expansion=none:fontcolor=white:fontsize=14:x=8:y=(h-text_h)/2",
        "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-movflags", "+faststart",
        str(tmp),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    os.replace(tmp, dest)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes: without this, Nagle + delayed ACK
        # add 40 ms to every keep-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # -- plumbing ------------------------------------------------------------------
    @property
    def st(self) -> SimState:
        return self.server.state

    def _send(self, code: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return None

    def _gate(self, protocol: str) -> bool:
        """Auth, version header and provider-wide faults; False when an answer was sent."""
        st = self.st
        if self.headers.get("Authorization") != f"Bearer {st.token}":
            # Never echo what was sent: it may be a real token.
            self._send(401, {"detail": "Unauthenticated: invalid or missing API token"})
            return False
        if protocol == "runway" and not self.headers.get("X-Runway-Version"):
            self._send(400, {"error": "X-Runway-Version header is required"})
            return False
        with st.lock:
            if st.ratelimit > 0:
                st.ratelimit -= 1
                st.counts["429"] += 1
                ra = st.ratelimit_after
            else:
                ra = -1.0
            down = st.down > 0
            if down:
                st.down -= 1
        if ra >= 0:
            self._send(429, {"detail": "Request was throttled."}, {"Retry-After": f"{ra:g}"})
            return False
        if down:
            self._send(503, {"detail": "Service Unavailable"})
            return False
        return True

    def _url(self, path: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}{path}"

    # -- jobs --------------------------------------------------------------------------
    def _new_job(self, protocol: str, model: str, version: str | None, input: dict[str, Any]) -> SimJob:
        st = self.st
        faults = parse_faults(input)
        with st.lock:
            for w in st.faults_for_new:
                name, *args = w.split(":")
                faults.setdefault(name, [float(a) for a in args])
        work = st.work
        if "work" in faults:
            work = faults["work"][0] if faults["work"] else work
        job = SimJob(
            id=uuid.uuid4().hex[:20] if protocol == "replicate" else str(uuid.uuid4()),
            protocol=protocol,
            model=model,
            version=version,
            input=input,
            faults=faults,
            created=time.time(),
            work=work,
        )
        with st.lock:
            st.jobs[job.id] = job
            st.order.append(job.id)
            st.counts["jobs"] += 1
            if "duplicate" in faults:
                twin = SimJob(**{**job.__dict__, "id": uuid.uuid4().hex[:20], "hidden": True})
                st.jobs[twin.id] = twin
                st.order.append(twin.id)
                st.counts["jobs"] += 1
        return job

    def _output_url(self, job: SimJob) -> str:
        # Replicate: one URL, valid until a while after success; Runway: each GET signs a fresh one.
        base = time.time() if job.protocol == "runway" else (job.succeeded_at or time.time())
        exp = int(base + job.arg("expire", 0, 86400.0) + 0.999)
        sig = hmac.new(_SECRET, f"{job.id}:{exp}".encode(), hashlib.sha256).hexdigest()[:16]
        run = f"&run={job.polls}" if "recomplete" in job.faults else ""  # "completed again": a new URL
        return self._url(f"/files/{job.id}.mp4?exp={exp}&sig={sig}{run}")

    def _replicate_json(self, job: SimJob) -> dict[str, Any]:
        now = time.time()
        status = job.status(now)
        out: Any = None
        if status == "succeeded":
            url = self._output_url(job)
            out = [url] if job.input.get("num_outputs") else url
            if "output_object" in job.faults:
                out = {"video": url, "seed": 42}
            if "output_empty" in job.faults:
                out = []
        raw = _REPLICATE[status]
        if "weird_status" in job.faults and status in ("queued", "running", "throttled"):
            raw = "queued"
        input: Any = job.input
        if "retention" in job.faults and now - job.created >= job.arg("retention", 0, 0.0):
            # Removed by retention: the job is still shown, without its input and output.
            input, out = {}, None
        return {
            "id": job.id,
            "model": job.model,
            "version": job.version or "sim",
            "input": input,
            "status": raw,
            "output": out,
            # Real models echo their input in errors: a pasted secret must be masked by the client.
            "error": f"the model raised: simulated failure for {job.input.get('prompt')!r}"
            if status == "failed"
            else None,
            "logs": "",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(job.created))
            + f".{int(job.created % 1 * 1e6):06d}Z",
            "urls": {
                "get": self._url(f"/v1/predictions/{job.id}"),
                "cancel": self._url(f"/v1/predictions/{job.id}/cancel"),
            },
        }

    def _runway_json(self, job: SimJob) -> dict[str, Any]:
        status = job.status(time.time())
        raw = _RUNWAY[status]
        if "weird_status" in job.faults and status in ("queued", "running"):
            raw = "QUEUED"
        body: dict[str, Any] = {
            "id": job.id,
            "status": raw,
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(job.created)),
        }
        if status == "running":
            body["progress"] = round(min(0.99, (time.time() - job.created) / max(job.work, 0.01)), 2)
        if status == "succeeded":
            body["output"] = [self._output_url(job)]
            if "output_object" in job.faults:
                body["output"] = {"video": self._output_url(job)}
            if "output_empty" in job.faults:
                body["output"] = []
        if status == "failed":
            body["failure"] = f"simulated failure for {job.input.get('promptText')!r}"
            body["failureCode"] = "INTERNAL.BAD_OUTPUT.CODE01"
        return body

    def _poll(self, job_id: str) -> SimJob | None:
        """Count a poll and apply the job's poll faults; None when an answer was sent."""
        st = self.st
        with st.lock:
            job = st.jobs.get(job_id)
            st.counts["get"] += 1
            if job is not None:
                job.polls += 1
        if job is None or job.deleted or ("lose" in job.faults and job.polls > job.arg("lose", 0, 1)):
            self._send(404, {"detail": "Not found."})
            return None
        if "slow" in job.faults:
            time.sleep(job.arg("slow", 0, 1.0))
        if job.polls <= job.arg("get_5xx", 0, 0):
            self._send(500, {"detail": "Internal server error"})
            return None
        if job.polls <= job.arg("ratelimit", 0, 0):
            with st.lock:
                st.counts["429"] += 1
            self._send(429, {"detail": "throttled"}, {"Retry-After": f"{job.arg('ratelimit', 1, 1.0):g}"})
            return None
        return job

    def _create_faults(self, job_faults: dict[str, list[float]]) -> bool:
        """Faults that strike before a job exists; False when an answer was sent."""
        st = self.st
        with st.lock:
            quota = st.create_429 != 0
            if st.create_429 > 0:
                st.create_429 -= 1
            after, in_ms = st.create_429_after, st.create_429_ms
        if quota:
            with st.lock:
                st.counts["429"] += 1
            header = {"retry-after-ms": f"{after * 1000:g}"} if in_ms else {"Retry-After": f"{after:g}"}
            self._send(429, {"error": "You have exceeded your daily task limit."}, header)
            return False
        if "create_5xx" in job_faults:
            self._send(503, {"detail": "Service Unavailable"})
            return False
        return True

    def _after_create(self, job: SimJob, code: int, body: Any) -> None:
        if "create_5xx_after" in job.faults:
            self._send(502, {"detail": "Bad Gateway"})
        elif "create_timeout" in job.faults:
            time.sleep(job.arg("create_timeout", 0, 5.0))
            self._send(code, body)
        else:
            self._send(code, body)

    # -- routes --------------------------------------------------------------------------
    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        path, query = parts.path, parse_qs(parts.query)
        if path == "/_sim/stats":
            with self.st.lock:
                self._send(200, dict(self.st.counts))
            return
        if path.startswith("/files/"):
            self._file(path, query)
            return
        if path == "/v1/predictions":
            if not self._gate("replicate"):
                return
            self._list(query)
            return
        m = re.fullmatch(r"/v1/predictions/([^/]+)", path)
        if m:
            if not self._gate("replicate"):
                return
            job = self._poll(m.group(1))
            if job is not None:
                self._send(200, self._replicate_json(job))
            return
        m = re.fullmatch(r"/v1/tasks/([^/]+)", path)
        if m:
            if not self._gate("runway"):
                return
            job = self._poll(m.group(1))
            if job is not None:
                self._send(200, self._runway_json(job))
            return
        self._send(404, {"detail": "Not found."})

    def do_POST(self) -> None:
        st = self.st
        path = urlsplit(self.path).path
        if path == "/_sim/control":
            self._control(self._body() or {})
            return
        if path == "/_sim/reset":
            with st.lock:
                st.jobs.clear()
                st.order.clear()
                st.counts.clear()
                st.faults_for_new.clear()
                st.create_log.clear()
                st.ratelimit = st.down = st.create_429 = st.list_fail = 0
            self._send(200, {"ok": True})
            return
        m = re.fullmatch(r"/v1/models/([^/]+)/([^/]+)/predictions", path)
        m = m or re.fullmatch(r"/v1/deployments/([^/]+)/([^/]+)/predictions", path)
        if m or path == "/v1/predictions":
            body = self._body()
            with st.lock:
                st.counts["create"] += 1
                inp = body.get("input") if isinstance(body, dict) else None
                st.create_log.append((time.time(), inp if isinstance(inp, dict) else {}))
            if not self._gate("replicate"):
                return
            if not isinstance(body, dict) or not isinstance(body.get("input"), dict):
                self._send(422, {"detail": "input is required"})
                return
            if m is None and not body.get("version"):
                self._send(422, {"detail": "version is required"})
                return
            if not self._create_faults(parse_faults(body["input"])):
                return
            model = f"{m.group(1)}/{m.group(2)}" if m else "sim/versioned"
            job = self._new_job("replicate", model, body.get("version"), body["input"])
            self._after_create(job, 201, self._replicate_json(job))
            return
        m = re.fullmatch(r"/v1/predictions/([^/]+)/cancel", path)
        if m:
            if not self._gate("replicate"):
                return
            self._cancel(m.group(1), lambda j: self._send(200, self._replicate_json(j)))
            return
        m = re.fullmatch(r"/v1/(image_to_video|text_to_video|video_to_video)", path)
        if m:
            body = self._body()
            with st.lock:
                st.counts["create"] += 1
                inp = {k: v for k, v in body.items() if k != "model"} if isinstance(body, dict) else {}
                st.create_log.append((time.time(), inp))
            if not self._gate("runway"):
                return
            if not isinstance(body, dict) or not body.get("model"):
                self._send(400, {"error": "model is required"})
                return
            if m.group(1) == "image_to_video" and not body.get("promptImage"):
                self._send(400, {"error": "promptImage is required"})
                return
            input = {k: v for k, v in body.items() if k != "model"}
            if not self._create_faults(parse_faults(input)):
                return
            job = self._new_job("runway", body["model"], None, input)
            self._after_create(job, 200, {"id": job.id})
            return
        self._send(404, {"detail": "Not found."})

    def do_DELETE(self) -> None:
        m = re.fullmatch(r"/v1/tasks/([^/]+)", urlsplit(self.path).path)
        if not m:
            self._send(404, {"error": "Not found"})
            return
        if not self._gate("runway"):
            return
        st = self.st
        with st.lock:
            job = st.jobs.get(m.group(1))
            done = job is not None and not job.deleted and job.status(time.time()) in ("succeeded", "failed")
            if done and job is not None:
                # Runway: DELETE of a finished task deletes it (no refund); it is gone for good.
                job.deleted = True
                st.counts["deleted"] += 1
                st.counts["deleted_succeeded"] += job.status(time.time()) == "succeeded"
        if done:
            self._send(204)
            return
        self._cancel(m.group(1), lambda j: self._send(204))

    def _cancel(self, job_id: str, answer: Any) -> None:
        st = self.st
        with st.lock:
            st.counts["cancel"] += 1
            job = st.jobs.get(job_id)
            if (
                job is not None
                and job.canceled_at is None
                and job.status(time.time()) not in ("succeeded", "failed")
            ):
                job.canceled_at = time.time()
        if job is None:
            self._send(404, {"detail": "Not found."})
        else:
            answer(job)

    def _list(self, query: dict[str, list[str]]) -> None:
        st = self.st
        with st.lock:
            st.counts["list"] += 1
            failing = st.list_fail != 0
            if st.list_fail > 0:
                st.list_fail -= 1
            ids = [i for i in reversed(st.order) if st.jobs[i].protocol == "replicate"]
        if failing:
            self._send(500, {"detail": "Internal server error"})
            return
        start = int((query.get("cursor") or ["0"])[0] or 0)
        page = ids[start : start + st.page_size]
        nxt = start + st.page_size
        self._send(
            200,
            {
                "results": [self._replicate_json(st.jobs[i]) for i in page],
                "next": self._url(f"/v1/predictions?cursor={nxt}") if nxt < len(ids) else None,
                "previous": None,
            },
        )

    def _control(self, body: dict[str, Any]) -> None:
        st = self.st
        with st.lock:
            if "faults" in body:
                st.faults_for_new = [str(f) for f in body["faults"]]
            if "ratelimit" in body:
                st.ratelimit = int(body["ratelimit"].get("count", 1))
                st.ratelimit_after = float(body["ratelimit"].get("retry_after", 1.0))
            if "down" in body:
                st.down = int(body["down"])
            if "work" in body:
                st.work = float(body["work"])
            _control_more(st, body)
        self._send(200, {"ok": True})

    def _file(self, path: str, query: dict[str, list[str]]) -> None:
        st = self.st
        m = re.fullmatch(r"/files/([^/]+)\.mp4", path)
        job = st.jobs.get(m.group(1)) if m else None
        with st.lock:
            st.counts["download"] += 1
        exp = (query.get("exp") or ["0"])[0]
        sig = (query.get("sig") or [""])[0]
        if job is None or job.deleted or not exp.isdigit():
            self._send(404, {"detail": "Not found."})
            return
        with st.lock:
            job.downloads += 1
            tries = job.downloads
        if tries <= job.arg("file_401", 0, 0.0):
            self._send(401, {"detail": "Unauthorized"})
            return
        good = hmac.new(_SECRET, f"{job.id}:{exp}".encode(), hashlib.sha256).hexdigest()[:16]
        if not hmac.compare_digest(good, sig) or time.time() > int(exp):
            self._send(403, {"detail": "Request has expired"})
            return
        data = self._render(job)
        digest = hashlib.sha256(b"other bytes" if "bad_checksum" in job.faults else data).digest()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if "not_video" in job.faults else "video/mp4")
        if "gzip" not in job.faults:
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Digest", f"sha-256=:{base64.b64encode(digest).decode()}:")
        else:
            packed = gzip.compress(data, mtime=0)
            self.send_header("Content-Length", str(len(packed)))
        if "gzip" in job.faults:
            # Compressed in transit although the client asked for identity; Repr-Digest covers the video.
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Repr-Digest", f"sha-256=:{base64.b64encode(digest).decode()}:")
            self.end_headers()
            self.wfile.write(packed)
            return
        if "truncate" in job.faults:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if "trickle" in job.faults:
            step, pause = int(job.arg("trickle", 0, 64)), job.arg("trickle", 1, 3.0)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                for i in range(0, len(data), max(1, step)):
                    self.wfile.write(data[i : i + step])
                    self.wfile.flush()
                    time.sleep(pause)
            except OSError:
                pass  # the client gave up on the trickle: expected
            return
        self.end_headers()
        self.wfile.write(data)

    def _render(self, job: SimJob) -> bytes:
        st = self.st
        if "not_video" in job.faults:
            return b"<html><body>This is not a video.</body></html>\n" * 20
        dest = st.files / f"{job.id}.mp4"
        with st.lock:
            lock = st.render_locks.setdefault(job.id, threading.Lock())
        with lock:
            if not dest.exists():
                prompt = str(job.input.get("prompt") or job.input.get("promptText") or job.id)
                prompt = _FAULT.sub("", prompt).strip() or job.id
                w = int(min(max(int(job.input.get("width", 320)), 16), 1920)) // 2 * 2
                h = int(min(max(int(job.input.get("height", 180)), 16), 1080)) // 2 * 2
                d = float(min(max(float(job.input.get("duration", 1)), 0.2), 10))
                render_mp4(dest, f"{prompt} [{job.id[:8]}]", w, h, d)
                with st.lock:
                    st.counts["rendered"] += 1
        return dest.read_bytes()


def _control_more(st: SimState, body: dict[str, Any]) -> None:
    """The provider-wide faults added with the trust work (caller holds the lock)."""
    if "create_429" in body:
        st.create_429 = int(body["create_429"].get("count", 1))
        st.create_429_after = float(body["create_429"].get("retry_after", 1.0))
        st.create_429_ms = bool(body["create_429"].get("ms", False))
    if "list_fail" in body:
        st.list_fail = int(body["list_fail"])


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256
    state: SimState

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (a timeout fault) closes its socket: expected, not news


class ProviderSim:
    """The simulator, in-process: ``with ProviderSim() as sim: ... sim.url ...``."""

    def __init__(
        self, token: str = "simtoken-0123456789", *, port: int = 0, work: float = 0.3, page_size: int = 100
    ):
        self._dir = Path(tempfile.mkdtemp(prefix="provsim-"))
        self.server = _Server(("127.0.0.1", port), _Handler)
        self.server.state = SimState(token=token, work=work, page_size=page_size, files=self._dir)
        self.token = token
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def state(self) -> SimState:
        return self.server.state

    def stats(self) -> dict[str, int]:
        with self.state.lock:
            return dict(self.state.counts)

    def control(self, **body: Any) -> None:
        with self.state.lock:
            st = self.state
            if "faults" in body:
                st.faults_for_new = [str(f) for f in body["faults"]]
            if "ratelimit" in body:
                st.ratelimit = int(body["ratelimit"].get("count", 1))
                st.ratelimit_after = float(body["ratelimit"].get("retry_after", 1.0))
            if "down" in body:
                st.down = int(body["down"])
            if "work" in body:
                st.work = float(body["work"])
            _control_more(st, body)

    def job(self, job_id: str) -> SimJob:
        return self.state.jobs[job_id]

    def output_sha256(self, job_id: str) -> str | None:
        """The sha256 of the output the simulator made for ``job_id`` (``None``: not made yet)."""
        path = self.state.files / f"{job_id}.mp4"
        try:
            return hashlib.sha256(path.read_bytes()).hexdigest()
        except FileNotFoundError:
            return None

    def start(self) -> ProviderSim:
        self._thread = threading.Thread(target=self.server.serve_forever, name="provsim", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> ProviderSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="A Replicate/Runway-compatible provider simulator on 127.0.0.1.")
    ap.add_argument("--port", type=int, default=8471)
    ap.add_argument("--token", default=os.environ.get("PROVSIM_TOKEN", "simtoken-0123456789"))
    ap.add_argument("--work", type=float, default=2.0, help="seconds a generation takes (default 2)")
    ap.add_argument("--page-size", type=int, default=100)
    args = ap.parse_args(argv)
    sim = ProviderSim(args.token, port=args.port, work=args.work, page_size=args.page_size)
    # A stop signal ends the server as Ctrl-C does, through the finally below: SIGTERM's
    # default action would leave the generated files' folder in /tmp behind.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(
        f"provsim: listening on {sim.url} (Replicate and Runway APIs); stats at {sim.url}/_sim/stats",
        flush=True,
    )
    try:
        sim.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sim.server.server_close()
        shutil.rmtree(sim._dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
