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
so :meth:`Runway.find` can never prove that a create whose reply was lost made
nothing: such an attempt fails as "ambiguous create: check the provider".
Runway's 429 on a create means the organisation's daily quota is spent
(:attr:`Runway.quota_on_create_429`): jobs wait for it rather than fail.
``THROTTLED`` is Runway's own queue (the concurrency limit): that time does not
count against the attempt's deadline. A task fetched again returns fresh
signed output URLs, so an expired URL is refreshed by :meth:`Runway.get`.
``DELETE`` of a finished task deletes it (no refund) and makes it unfetchable:
the generate kind never cancels a task it has not first seen unfinished.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any
from urllib.parse import quote

from spool.kinds.generate.providers.base import HttpProvider, Lookup, RemoteJob, Status, pick_video

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
    quota_on_create_429 = True
    cancel_deletes = True

    def extra_headers(self) -> dict[str, str]:
        return {"X-Runway-Version": self.config.api_version}

    def to_job(self, data: Any, operation: str) -> RemoteJob:
        if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
            raise self.bad_reply(operation, "answered without a task id")
        raw = str(data.get("status", ""))
        status: Status = _STATUS.get(raw, "unknown")
        outputs: list[str] = []
        problem = None
        if status == "succeeded":
            url, problem = pick_video(data.get("output"), self.config.output_key)
            outputs = [url] if url else []
        failure = data.get("failure")
        code = data.get("failureCode")
        error = None
        if failure or code:
            error = self._mask(f"{failure or 'failed'}" + (f" ({code})" if code else ""))[:500]
        return RemoteJob(
            id=data["id"],
            status=status,
            raw_status=raw or "(none)",
            outputs=outputs,
            output_problem=problem,
            error=error,
            created_at=data.get("createdAt") if isinstance(data.get("createdAt"), str) else None,
            throttled=raw == "THROTTLED",
        )

    def describe_create(self, model: str, input: dict[str, Any]) -> str:
        return f"POST {route(model, input)[0]}"

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

    def find(self, model: str, input: dict[str, Any], since: datetime) -> Lookup:
        return Lookup(supported=False, why="Runway documents no task listing")
