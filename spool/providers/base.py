"""The provider contract: what spool needs from a hosted video model, and nothing more.

A provider is five operations (:class:`Provider`): ``create`` a generation
under spool's idempotency key, ``get`` its state, ``cancel`` it, ``find`` it
again after a crash lost the create's answer, and ``download`` its output to a
path while hashing, within a length limit. Statuses are normalised to
:data:`Status`; every failure is a :class:`ProviderError` whose ``outcome``
says what the caller may do next:

* ``retryable``: nothing happened that costs money or changes state; ask again
  later (after ``retry_after`` when the provider said so).
* ``final``: asking again will not help (bad input, bad token, the provider
  lost the job, an expired output URL); the error says the next action.
* ``ambiguous``: only for ``create``: the request may have reached the
  provider (a timeout or a 5xx after sending). Never resubmit blindly: ``find``
  first (spool's "submit once" rule, SPEC section 8).

The token is sent only to ``base_url``'s origin (output URLs on other hosts
get no ``Authorization``), and no message this module builds contains it:
provider replies pass :func:`spool.secrets.redact` and a local mask.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import hashlib
import os
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import msgspec

from .. import secrets
from ..errors import SpoolError
from .config import ProviderConfig

#: Normalised provider statuses. ``queued`` covers "accepted, not started" and
#: "throttled"; ``failed`` covers the provider's own aborts.
Status = Literal["queued", "running", "succeeded", "failed", "canceled"]
#: Statuses after which a generation never changes at the provider.
FINAL: frozenset[str] = frozenset({"succeeded", "failed", "canceled"})

Outcome = Literal["retryable", "final", "ambiguous"]

#: The next action a user reads when a create's fate cannot be told (SPEC section 8).
CHECK_PROVIDER = "check the provider; spool retry submits again"
#: Largest excerpt of a provider's reply quoted in an error.
EXCERPT = 200


class RemoteJob(msgspec.Struct, kw_only=True):
    """A generation as the provider reports it, normalised."""

    id: str
    status: Status
    #: The provider's own word (``processing``, ``THROTTLED``, ...), for humans and metrics.
    raw_status: str
    #: Output URLs (a provider with one output gives a list of one).
    outputs: list[str] = []
    #: The provider's failure message (redacted), if it failed.
    error: str | None = None
    created_at: str | None = None
    #: The input the provider holds for this job (from listings; used to match after a crash).
    input: dict[str, Any] | None = None
    #: The model (``owner/name``) or version the job runs.
    model: str | None = None

    @property
    def final(self) -> bool:
        return self.status in FINAL


class Lookup(msgspec.Struct, kw_only=True):
    """The answer of :meth:`Provider.find` after a crash lost a create's reply.

    ``found``: exactly one job matches; ``none``: the provider's listing covered
    the time since the intent and nothing matched; ``ambiguous``: more than one
    matched; ``unsupported``: the provider offers neither idempotency keys nor a
    listing, so it cannot tell.
    """

    outcome: Literal["found", "none", "ambiguous", "unsupported"]
    job: RemoteJob | None = None
    candidates: list[str] = []
    #: How many of the provider's jobs were compared.
    searched: int = 0


class Downloaded(msgspec.Struct, kw_only=True):
    """A verified download: the byte count and hash of what is now at ``path``."""

    path: str
    size: int
    sha256: str
    #: Whether the provider sent a checksum that was checked (``Content-Digest``).
    checksum_checked: bool = False
    content_type: str | None = None


class ProviderError(SpoolError):
    """A provider operation that did not give an answer; ``outcome`` says what may follow."""

    def __init__(
        self,
        provider: str,
        operation: str,
        problem: str,
        *,
        outcome: Outcome,
        code: str,
        http_status: int | None = None,
        retry_after: float | None = None,
        next_action: str | None = None,
    ) -> None:
        self.provider = provider
        self.operation = operation
        self.problem = secrets.redact(problem)
        self.outcome: Outcome = outcome
        #: A short machine tag: rate_limited, server_error, timeout, connect, unauthorized,
        #: lost, invalid, bad_reply, truncated, too_large, checksum, expired, http.
        self.code = code
        self.http_status = http_status
        self.retry_after = retry_after
        self.next_action = next_action
        text = f"provider {provider!r}: {operation} {self.problem}"
        if next_action:
            text += f"; next: {next_action}"
        super().__init__(text)

    @property
    def retryable(self) -> bool:
        return self.outcome == "retryable"

    @property
    def poll_outcome(self) -> str:
        """This failure as :data:`spool.polling.Outcome` (``done``: stop polling, the attempt fails)."""
        if self.code in ("rate_limited", "server_error"):
            return self.code
        return "error" if self.outcome == "retryable" else "done"

    @property
    def back_pressure(self) -> bool:
        """Whether the whole provider (not just this job) should be left alone for a while."""
        return self.code in ("rate_limited", "server_error")


# -- pure helpers --------------------------------------------------------------


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_status(code: int) -> tuple[Outcome, str]:
    """An HTTP error status -> (outcome, code) for a request that reached the provider.

    429 and 5xx are the provider's own trouble (retryable, and back-pressure for
    all its jobs); 401/403 is the token; 404 a job the provider does not know;
    other 4xx the request itself.
    """
    if code == 429:
        return "retryable", "rate_limited"
    if code >= 500 or code == 408:
        return "retryable", "server_error"
    if code in (401, 403):
        return "final", "unauthorized"
    if code in (404, 410):
        return "final", "lost"
    return "final", "invalid"


def parse_content_digest(
    headers: Mapping[str, str], names: tuple[str, ...] = ("content-digest", "repr-digest")
) -> str | None:
    """The sha-256 a server states for a body (RFC 9530 ``Content-Digest``/``Repr-Digest``), as hex.

    ``Content-Digest`` covers the bytes as sent, ``Repr-Digest`` the decoded
    representation: with a ``Content-Encoding`` only the latter applies to the file.
    """
    for name in names:
        raw = headers.get(name)
        if not raw:
            continue
        for part in raw.split(","):
            algo, _, value = part.strip().partition("=")
            if algo.strip().lower() == "sha-256" and value.startswith(":") and value.endswith(":"):
                try:
                    return base64.b64decode(value[1:-1], validate=True).hex()
                except (binascii.Error, ValueError):
                    return "unreadable"
    return None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or ""), parts.port


# -- the contract ----------------------------------------------------------------


class Provider(ABC):
    """What a provider kind implements. One instance per ``[providers.<name>]``."""

    #: The kind's name in ``[providers.<name>] kind`` and the entry-point group.
    kind: str = ""
    #: Whether ``find`` can tell a lost create apart (keys or a listing with inputs).
    can_find: bool = False

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.name = config.name
        #: What this client did, for the daemon's metrics: ``call.<operation>``
        #: (requests sent), ``error.<code>`` (each :class:`ProviderError`), ``bytes``
        #: (downloaded and verified). Only ever grows.
        self.counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    def count(self, what: str, n: int = 1) -> None:
        with self._counts_lock:
            self.counts[what] += n

    def counted(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self.counts)

    @abstractmethod
    def create(self, model: str, input: dict[str, Any], key: str) -> RemoteJob:
        """Start a generation; ``key`` is spool's idempotency key (job + attempt)."""

    @abstractmethod
    def get(self, job_id: str) -> RemoteJob:
        """The generation's state now."""

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Ask the provider to stop (and stop charging for) a generation."""

    @abstractmethod
    def find(self, model: str, input: dict[str, Any], key: str, since: datetime) -> Lookup:
        """Look for the generation a create with ``key``/``input`` made at or after ``since``."""

    @abstractmethod
    def download(self, url: str, dest: Path, *, expected_sha256: str | None = None) -> Downloaded:
        """Stream ``url`` into ``dest`` while hashing, within ``download.max_bytes``."""

    def close(self) -> None:  # noqa: B027 - optional for kinds without connections
        """Release connections."""


class HttpProvider(Provider):
    """Shared HTTP plumbing for kinds that speak JSON over HTTPS with a Bearer token."""

    def __init__(
        self,
        config: ProviderConfig,
        token: str,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(config)
        self._token = token
        self._client = httpx.Client(
            base_url=config.base_url,
            timeout=httpx.Timeout(config.request_timeout, connect=min(10.0, config.request_timeout)),
            headers={"Authorization": f"Bearer {token}", **self.extra_headers()},
            transport=transport,
            follow_redirects=False,  # a redirect would carry the token elsewhere
        )
        # Downloads carry no token: output URLs are signed or public, often on another host.
        self._downloads = httpx.Client(
            timeout=httpx.Timeout(config.download.timeout, connect=min(10.0, config.download.timeout)),
            transport=transport,
            follow_redirects=True,
        )

    def extra_headers(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        self._client.close()
        self._downloads.close()

    # -- messages --------------------------------------------------------------
    def _mask(self, text: str) -> str:
        """``text`` safe to keep: the token masked even if spool.secrets was never told of it."""
        text = secrets.redact(text)
        return text.replace(self._token, secrets.MASK) if self._token else text

    def _excerpt(self, resp: httpx.Response) -> str:
        try:
            body = resp.text
        except (httpx.HTTPError, UnicodeDecodeError):
            body = ""
        body = " ".join(body.split())[:EXCERPT]
        return self._mask(body)

    def error(self, operation: str, problem: str, **kw: Any) -> ProviderError:
        self.count(f"error.{kw.get('code', 'http')}")
        return ProviderError(self.name, operation, self._mask(problem), **kw)

    # -- requests ----------------------------------------------------------------
    def request(
        self,
        operation: str,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        creates: bool = False,
    ) -> Any:
        """One API call -> its JSON reply (``None`` for an empty one), or a :class:`ProviderError`.

        ``creates`` marks a request that may cost money: a failure after the
        request could have been sent is ``ambiguous``, not ``retryable``.
        """
        self.count(f"call.{operation}")
        try:
            resp = self._client.request(method, path, json=body, params=params)
        except httpx.ConnectError as exc:
            # Nothing was sent: safe to retry, even a create.
            raise self.error(
                operation,
                f"could not connect to {self.config.base_url} ({exc})",
                outcome="retryable",
                code="connect",
            ) from None
        except httpx.TimeoutException as exc:
            raise self.error(
                operation,
                f"got no reply within {self.config.request_timeout:g} s ({type(exc).__name__})",
                outcome="ambiguous" if creates else "retryable",
                code="timeout",
            ) from None
        except httpx.HTTPError as exc:
            raise self.error(
                operation,
                f"failed in transit ({type(exc).__name__}: {exc})",
                outcome="ambiguous" if creates else "retryable",
                code="server_error",
            ) from None
        if resp.status_code >= 400:
            outcome, code = classify_status(resp.status_code)
            if creates and code == "server_error":
                outcome = "ambiguous"  # a gateway's 5xx can follow a create the backend did make
            retry_after = parse_retry_after(resp.headers.get("retry-after"))
            next_action = {
                "unauthorized": f"check the token in the environment variable {self.config.token_env}",
                "lost": "the provider does not know this job; spool retry submits again (and costs)",
            }.get(code)
            raise self.error(
                operation,
                f"answered HTTP {resp.status_code}: {self._excerpt(resp) or resp.reason_phrase}",
                outcome=outcome,
                code=code,
                http_status=resp.status_code,
                retry_after=retry_after,
                next_action=next_action,
            )
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise self.error(
                operation,
                f"answered HTTP {resp.status_code} with a body that is not JSON: {self._excerpt(resp)!r}",
                outcome="ambiguous" if creates else "retryable",
                code="bad_reply",
                http_status=resp.status_code,
            ) from None

    def bad_reply(self, operation: str, problem: str, *, creates: bool = False) -> ProviderError:
        return self.error(
            operation, problem, outcome="ambiguous" if creates else "retryable", code="bad_reply"
        )

    # -- downloads -----------------------------------------------------------------
    def download(self, url: str, dest: Path, *, expected_sha256: str | None = None) -> Downloaded:
        """Stream ``url`` into ``dest`` (created or truncated) while hashing.

        Checked, in order: the HTTP status (403/404/410: the URL expired, final),
        ``download.max_bytes`` (final), the ``Content-Length`` against the bytes
        received (truncated: retryable from the same URL), and the provider's
        ``Content-Digest`` sha-256 and ``expected_sha256`` (mismatch: retryable).
        On any failure ``dest`` is removed, so a partial file is never promoted.
        The file is fsynced before this returns.
        """
        op = "download"
        limit = self.config.download.max_bytes_int
        digest = hashlib.sha256()
        size = 0
        headers = {"Accept-Encoding": "identity"}
        if _origin(url) == _origin(self.config.base_url):
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            with self._downloads.stream("GET", url, headers=headers) as resp:
                if resp.status_code in (401, 403, 404, 410):
                    raise self.error(
                        op,
                        f"of the output answered HTTP {resp.status_code}: the output URL has expired or gone",
                        outcome="final",
                        code="expired",
                        http_status=resp.status_code,
                        next_action="spool retry generates again (and costs); the provider keeps outputs "
                        "only for a while",
                    )
                if resp.status_code >= 400:
                    outcome, code = classify_status(resp.status_code)
                    raise self.error(
                        op,
                        f"of the output answered HTTP {resp.status_code}",
                        outcome="retryable" if code in ("rate_limited", "server_error") else outcome,
                        code=code,
                        http_status=resp.status_code,
                        retry_after=parse_retry_after(resp.headers.get("retry-after")),
                    )
                declared = resp.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limit:
                    raise self._too_large(int(declared), limit)
                # spool asks for identity; a server that still compresses is decoded, and then
                # only the representation's length and digest can be checked.
                encoded = resp.headers.get("content-encoding", "identity").lower() != "identity"
                if encoded:
                    declared = None
                stated = parse_content_digest(
                    resp.headers, ("repr-digest",) if encoded else ("content-digest", "repr-digest")
                )
                chunks = resp.iter_bytes(1 << 16) if encoded else resp.iter_raw(1 << 16)
                with open(dest, "wb") as f:
                    for chunk in chunks:
                        size += len(chunk)
                        if size > limit:
                            raise self._too_large(size, limit)
                        digest.update(chunk)
                        f.write(chunk)
                    f.flush()
                    os.fsync(f.fileno())
                if declared is not None and declared.isdigit() and size != int(declared):
                    raise self._truncated(size, int(declared))
                got = digest.hexdigest()
                for what, want in (
                    ("the provider's Content-Digest", stated),
                    ("the expected", expected_sha256),
                ):
                    if want is not None and want != got:
                        raise self.error(
                            op,
                            f"checksum mismatch: {what} sha-256 is {want[:16]}…, the bytes received hash to "
                            f"{got[:16]}…",
                            outcome="retryable",
                            code="checksum",
                            next_action="spool downloads again from the same URL",
                        )
                self.count("bytes", size)
                return Downloaded(
                    path=str(dest),
                    size=size,
                    sha256=got,
                    checksum_checked=stated is not None or expected_sha256 is not None,
                    content_type=resp.headers.get("content-type"),
                )
        except ProviderError:
            _unlink(dest)
            raise
        except httpx.RemoteProtocolError as exc:
            # The server closed the connection before the declared length: truncated.
            _unlink(dest)
            raise self.error(
                op,
                f"was cut off after {size} bytes ({exc})",
                outcome="retryable",
                code="truncated",
                next_action="spool downloads again from the same URL",
            ) from None
        except httpx.TimeoutException:
            _unlink(dest)
            raise self.error(
                op,
                f"stalled after {size} bytes (timeout {self.config.download.timeout:g} s)",
                outcome="retryable",
                code="timeout",
            ) from None
        except httpx.HTTPError as exc:
            _unlink(dest)
            raise self.error(
                op, f"failed after {size} bytes ({type(exc).__name__})", outcome="retryable", code="http"
            ) from None
        except BaseException:
            _unlink(dest)
            raise

    def _too_large(self, size: int, limit: int) -> ProviderError:
        return self.error(
            "download",
            f"of the output exceeds [providers.{self.name}] download.max_bytes ({size} > {limit} bytes)",
            outcome="final",
            code="too_large",
            next_action=f"raise [providers.{self.name}] download.max_bytes if the file is expected",
        )

    def _truncated(self, size: int, declared: int) -> ProviderError:
        return self.error(
            "download",
            f"was truncated: {size} of {declared} bytes arrived",
            outcome="retryable",
            code="truncated",
            next_action="spool downloads again from the same URL",
        )


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
