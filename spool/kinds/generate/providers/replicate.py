"""Replicate's predictions API (https://replicate.com/docs/reference/http).

* create: ``POST /v1/models/{owner}/{name}/predictions`` with ``{"input": ...}``
  for an official model (``model = "owner/name"``); ``POST /v1/predictions``
  with ``{"version": ..., "input": ...}`` for a pinned version
  (``model = "owner/name:<version>"`` or a bare 64-hex version id); ``POST
  /v1/deployments/{owner}/{name}/predictions`` for a deployment
  (``model = "deployment:owner/name"``);
* get: ``GET /v1/predictions/{id}``; cancel: ``POST /v1/predictions/{id}/cancel``;
* list: ``GET /v1/predictions`` (the whole account, newest first, cursor pages);
* statuses ``starting``/``processing`` (queued/running), ``succeeded``,
  ``failed``, ``canceled``, ``aborted`` (failed: stopped before it ran); any
  other status is ``unknown`` (polled on, never taken for final);
* ``output``: any JSON; the video is picked by :func:`.base.pick_video` (a URL,
  the first URL of a list, or ``[providers.<name>] output_key`` of an object).

Idempotency: Replicate documents no idempotency key for predictions, so spool
sends none. After a create whose reply was lost, :meth:`Replicate.find` lists
the account's predictions back past the intent (every page of the window) and
reports those with the frozen model and input, and those whose input the
listing no longer shows: Replicate removes an API prediction's input and output
an hour after it is made, so after that a listing can no longer tell.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from spool.kinds.generate.providers.base import HttpProvider, Lookup, RemoteJob, Status, origin, pick_video

_STATUS: dict[str, Status] = {
    "starting": "queued",
    "processing": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "canceled": "canceled",
    "aborted": "failed",
}
_VERSION = re.compile(r"^[0-9a-f]{64}$")
#: Listing pages ``find`` reads at most, and seconds it may spend: a window longer
#: than that is reported as not covered (the caller treats it as "cannot tell").
FIND_PAGES = 2000
FIND_SECONDS = 120.0


def split_model(model: str) -> tuple[str, str]:
    """``model`` -> (form, value): ``("model", "owner/name")``, ``("version", "<id>")`` or
    ``("deployment", "owner/name")``."""
    if model.startswith("deployment:"):
        return "deployment", model.split(":", 1)[1]
    if _VERSION.match(model):
        return "version", model
    if ":" in model:
        return "version", model.rsplit(":", 1)[1]
    return "model", model


def _iso(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class Replicate(HttpProvider):
    kind = "replicate"
    can_find = True

    def to_job(self, data: Any, operation: str, *, creates: bool = False) -> RemoteJob:
        """A prediction object -> :class:`RemoteJob`; one without an ID is a located error."""
        if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
            raise self.bad_reply(operation, "answered without a prediction id", creates=creates)
        raw = str(data.get("status", ""))
        status: Status = _STATUS.get(raw, "unknown")
        outputs: list[str] = []
        problem = None
        if status == "succeeded":
            url, problem = pick_video(data.get("output"), self.config.output_key)
            outputs = [url] if url else []
        err = data.get("error")
        input = data.get("input")
        return RemoteJob(
            id=data["id"],
            status=status,
            raw_status=raw or "(none)",
            outputs=outputs,
            output_problem=problem,
            error=self._mask(str(err))[:500] if err else None,
            created_at=data.get("created_at") if isinstance(data.get("created_at"), str) else None,
            input=input if isinstance(input, dict) and input else None,
            model=data.get("model") or data.get("version"),
        )

    def _route(self, model: str, input: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        form, value = split_model(model)
        if form == "version":
            return "/v1/predictions", {"version": value, "input": input}
        if form == "deployment":
            return f"/v1/deployments/{value}/predictions", {"input": input}
        return f"/v1/models/{value}/predictions", {"input": input}

    def describe_create(self, model: str, input: dict[str, Any]) -> str:
        return f"POST {self._route(model, input)[0]}"

    def create(self, model: str, input: dict[str, Any], key: str) -> RemoteJob:
        path, body = self._route(model, input)
        data = self.request("create", "POST", path, body=body, creates=True)
        return self.to_job(data, "create", creates=True)

    def get(self, job_id: str) -> RemoteJob:
        return self.to_job(self.request("get", "GET", f"/v1/predictions/{quote(job_id, safe='')}"), "get")

    def cancel(self, job_id: str) -> None:
        self.request("cancel", "POST", f"/v1/predictions/{quote(job_id, safe='')}/cancel")

    def find(self, model: str, input: dict[str, Any], since: datetime) -> Lookup:
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        form, value = split_model(model)
        found = Lookup()
        url: str | None = "/v1/predictions"
        started = time.monotonic()
        while url is not None:
            if found.pages >= FIND_PAGES or time.monotonic() - started > FIND_SECONDS:
                found.why = (
                    f"the listing has more predictions since the intent than {found.pages} pages "
                    f"({found.searched} predictions) could show"
                )
                return found
            data = self.request("find", "GET", url)
            found.pages += 1
            if not isinstance(data, dict) or not isinstance(data.get("results"), list):
                raise self.bad_reply("find", "listed predictions without a results list")
            for item in data["results"]:
                found.searched += 1
                created = _iso(item.get("created_at") if isinstance(item, dict) else None)
                if created is None:
                    found.why = "the listing has a prediction without a creation time"
                    return found
                if created < since:
                    found.covered = True  # newest first: everything older is outside the window
                    continue
                job = self.to_job(item, "find")
                if job.input is None:
                    found.unknown.append(job)
                    continue
                if job.input != input:
                    continue
                if form == "version" and item.get("version") != value:
                    continue
                if form == "model" and item.get("model") not in (None, value):
                    continue
                found.matches.append(job)
            if found.covered:
                return found
            nxt = data.get("next")
            url = nxt if isinstance(nxt, str) and nxt else None
            if url is not None and url.startswith("http") and origin(url) != origin(self.config.base_url):
                found.why = "the listing's next page is on another host (the token is never sent there)"
                return found
        found.covered = True  # the listing ended: the account has nothing older
        return found
