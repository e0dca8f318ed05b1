"""Runway's developer API (https://docs.dev.runwayml.com/api/).

* create: ``POST /v1/image_to_video`` when the input has a ``promptImage``,
  else ``POST /v1/text_to_video``; the body is the frozen input plus
  ``model``. ``model = "<endpoint>:<model>"`` (``"video_to_video:gen4_aleph"``)
  names the endpoint explicitly. The reply is ``{"id": ...}``.
* get: ``GET /v1/tasks/{id}`` -> ``status`` PENDING/THROTTLED (queued),
  RUNNING, SUCCEEDED (``output``: a list of URLs), FAILED (``failure``,
  ``failureCode``), CANCELLED; cancel: ``DELETE /v1/tasks/{id}``.
* every request carries ``X-Runway-Version`` (``[providers.<name>] api_version``)
  and ``Authorization: Bearer <token>``.

Idempotency: Runway documents neither an idempotency key nor a task listing,
so :meth:`Runway.find` answers ``unsupported``: after a crash between the
intent record and the create's reply the attempt fails with "check the
provider; spool retry submits again" rather than risk paying twice.
Output URLs are signed and expire; an expired one is a located, final
download failure.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any
from urllib.parse import quote

from .base import HttpProvider, Lookup, RemoteJob, Status

_STATUS: dict[str, Status] = {
    "PENDING": "queued",
    "THROTTLED": "queued",
    "RUNNING": "running",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "CANCELLED": "canceled",
}
_ENDPOINT = re.compile(r"^(?P<endpoint>[a-z_]+):(?P<model>.+)$")


def route(model: str, input: dict[str, Any]) -> tuple[str, str]:
    """(endpoint path, model name) for a create."""
    m = _ENDPOINT.match(model)
    if m:
        return f"/v1/{m.group('endpoint')}", m.group("model")
    return ("/v1/image_to_video" if "promptImage" in input else "/v1/text_to_video"), model


class Runway(HttpProvider):
    kind = "runway"
    can_find = False

    def extra_headers(self) -> dict[str, str]:
        return {"X-Runway-Version": self.config.api_version}

    def to_job(self, data: Any, operation: str) -> RemoteJob:
        if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
            raise self.bad_reply(operation, "answered without a task id")
        raw = str(data.get("status", ""))
        if raw not in _STATUS:
            raise self.bad_reply(operation, f"reported the unknown status {raw!r}")
        out = data.get("output") or []
        if not isinstance(out, list) or not all(isinstance(u, str) for u in out):
            raise self.bad_reply(operation, "reported an output that is not a list of URLs")
        status = _STATUS[raw]
        if status == "succeeded" and not out:
            raise self.bad_reply(operation, "reported success without an output URL")
        failure = data.get("failure")
        code = data.get("failureCode")
        error = None
        if failure or code:
            error = self._mask(f"{failure or 'failed'}" + (f" ({code})" if code else ""))[:500]
        return RemoteJob(
            id=data["id"],
            status=status,
            raw_status=raw,
            outputs=list(out),
            error=error,
            created_at=data.get("createdAt"),
        )

    def create(self, model: str, input: dict[str, Any], key: str) -> RemoteJob:
        path, name = route(model, input)
        data = self.request("create", "POST", path, body={**input, "model": name}, creates=True)
        if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
            raise self.bad_reply("create", "answered without a task id", creates=True)
        return RemoteJob(id=data["id"], status="queued", raw_status="PENDING")

    def get(self, job_id: str) -> RemoteJob:
        return self.to_job(self.request("get", "GET", f"/v1/tasks/{quote(job_id, safe='')}"), "get")

    def cancel(self, job_id: str) -> None:
        self.request("cancel", "DELETE", f"/v1/tasks/{quote(job_id, safe='')}")

    def find(self, model: str, input: dict[str, Any], key: str, since: datetime) -> Lookup:
        return Lookup(outcome="unsupported")
