"""Replicate's predictions API (https://replicate.com/docs/reference/http).

* create: ``POST /v1/models/{owner}/{name}/predictions`` with ``{"input": ...}``
  for an official model (``model = "owner/name"``), or ``POST /v1/predictions``
  with ``{"version": ..., "input": ...}`` for a pinned version
  (``model = "owner/name:<version>"`` or a bare 64-hex version id);
* get: ``GET /v1/predictions/{id}``; cancel: ``POST /v1/predictions/{id}/cancel``;
* list: ``GET /v1/predictions`` (newest first, ``{"results": [...], "next": url}``);
* statuses ``starting``/``processing`` (queued/running), ``succeeded``,
  ``failed``, ``canceled``, ``aborted`` (failed: stopped before it ran);
* ``output``: a URL or a list of URLs; ``Authorization: Bearer <token>``.

Idempotency: Replicate's API documents no idempotency key for predictions, so
spool does not pretend to send one. After a crash between the intent record
and the create's reply, :meth:`Replicate.find` lists recent predictions (newest
first, back to the intent's time) and matches the model and the frozen input:
exactly one match is adopted; none or several mean "cannot tell" (the caller
fails the attempt with "check the provider; spool retry submits again").
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from .base import HttpProvider, Lookup, RemoteJob, Status, _origin

_STATUS: dict[str, Status] = {
    "starting": "queued",
    "processing": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "canceled": "canceled",
    "aborted": "failed",
}
_VERSION = re.compile(r"^[0-9a-f]{64}$")
#: Listing pages read at most by ``find`` (100 predictions each on Replicate).
FIND_PAGES = 10
#: Clock skew tolerated between spool's intent time and the provider's ``created_at``.
SKEW = timedelta(minutes=5)


def split_model(model: str) -> tuple[str | None, str | None]:
    """``owner/name`` -> (model path, None); ``owner/name:ver`` or ``ver`` -> (None, version)."""
    if _VERSION.match(model):
        return None, model
    if ":" in model:
        return None, model.rsplit(":", 1)[1]
    return model, None


def _iso(value: str | None) -> datetime | None:
    if not value:
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
        """A prediction object -> :class:`RemoteJob`; a malformed one is a located error."""
        if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
            raise self.bad_reply(operation, "answered without a prediction id", creates=creates)
        raw = str(data.get("status", ""))
        if raw not in _STATUS:
            raise self.bad_reply(operation, f"reported the unknown status {raw!r}", creates=creates)
        out = data.get("output")
        if out is None:
            outputs: list[str] = []
        elif isinstance(out, str):
            outputs = [out]
        elif isinstance(out, list) and all(isinstance(u, str) for u in out):
            outputs = list(out)
        else:
            raise self.bad_reply(operation, "reported an output that is neither a URL nor a list of URLs")
        status = _STATUS[raw]
        if status == "succeeded" and not outputs:
            raise self.bad_reply(operation, "reported success without an output URL")
        err = data.get("error")
        return RemoteJob(
            id=data["id"],
            status=status,
            raw_status=raw,
            outputs=outputs,
            error=self._mask(str(err))[:500] if err else None,
            created_at=data.get("created_at"),
            input=data.get("input") if isinstance(data.get("input"), dict) else None,
            model=data.get("model") or data.get("version"),
        )

    def create(self, model: str, input: dict[str, Any], key: str) -> RemoteJob:
        path, version = split_model(model)
        if version is not None:
            data = self.request(
                "create", "POST", "/v1/predictions", body={"version": version, "input": input}, creates=True
            )
        else:
            data = self.request(
                "create", "POST", f"/v1/models/{path}/predictions", body={"input": input}, creates=True
            )
        return self.to_job(data, "create", creates=True)

    def get(self, job_id: str) -> RemoteJob:
        return self.to_job(self.request("get", "GET", f"/v1/predictions/{quote(job_id, safe='')}"), "get")

    def cancel(self, job_id: str) -> None:
        self.request("cancel", "POST", f"/v1/predictions/{quote(job_id, safe='')}/cancel")

    def find(self, model: str, input: dict[str, Any], key: str, since: datetime) -> Lookup:
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        path, version = split_model(model)
        matches: list[RemoteJob] = []
        searched = 0
        url: str | None = "/v1/predictions"
        covered = False
        for _ in range(FIND_PAGES):
            if url is None:
                covered = True
                break
            data = self.request("find", "GET", url)
            if not isinstance(data, dict) or not isinstance(data.get("results"), list):
                raise self.bad_reply("find", "listed predictions without a results list")
            for item in data["results"]:
                searched += 1
                created = _iso(item.get("created_at") if isinstance(item, dict) else None)
                if created is not None and created < since - SKEW:
                    covered = True
                    continue
                if not isinstance(item, dict) or item.get("input") != input:
                    continue
                if version is not None and item.get("version") != version:
                    continue
                if path is not None and item.get("model") not in (None, path):
                    continue
                matches.append(self.to_job(item, "find"))
            if covered:
                break
            nxt = data.get("next")
            url = nxt if isinstance(nxt, str) and nxt else None
            if url is not None and url.startswith("http") and _origin(url) != _origin(self.config.base_url):
                break  # never send the token to another host; the search stays "cannot tell"
        if len(matches) == 1:
            return Lookup(outcome="found", job=matches[0], searched=searched)
        if len(matches) > 1:
            return Lookup(outcome="ambiguous", candidates=[m.id for m in matches], searched=searched)
        # Zero matches only counts as "none" when the listing reached back past the intent.
        return Lookup(outcome="none" if covered else "ambiguous", searched=searched)
