"""The provider contract: what spool needs from a hosted video model, and nothing more.

A provider is five operations (:class:`Provider`): ``create`` a generation,
``get`` its state, ``cancel`` it, ``find`` the jobs a create may have made
after its reply was lost, and ``download`` its output to a path while hashing,
within the transfer limits. Statuses are normalised to :data:`Status`; every
failure is a :class:`ProviderError` whose ``outcome`` says what the caller may
do next:

* ``retryable``: nothing happened that costs money or changes state; ask again
  later (after ``retry_after`` when the provider said so).
* ``final``: asking again will not help (bad input, bad token, the provider
  lost the job, an output that is gone); the error says the next action.
* ``ambiguous``: only for ``create``: the request may have reached the
  provider (a timeout, a 5xx, a malformed or lost reply). The caller never
  creates again unless ``find`` proves nothing was made (the generate
  workflow's "submit once" rule).

A create the provider certainly refused is ``retryable`` (429, connection
refused) or ``final`` (any other 4xx): nothing was made either way.

The token is sent only to ``base_url``'s origin (output URLs on other hosts
get no ``Authorization``), and no message this module builds contains it:
provider replies pass :func:`spool.core.secrets.redact` and a local mask.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import hashlib
import os
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec

from spool.core import secrets
from spool.kinds.base import Abort
from spool.kinds.generate.providers.config import ProviderConfig
from spool.kinds.generate.providers.errors import FINAL, Outcome, ProviderError, Status

#: Largest excerpt of a provider's reply quoted in an error.
EXCERPT = 200


class RemoteJob(msgspec.Struct, kw_only=True):
    """A generation as the provider reports it, normalised."""

    id: str
    status: Status
    #: The provider's own word (``processing``, ``THROTTLED``, ...), for humans and metrics.
    raw_status: str
    #: The video's URL, picked from the output by the kind's documented rule (a
    #: succeeded job without one has ``output_problem`` instead).
    outputs: list[str] = []
    #: Why a succeeded job's output holds no video (empty, an object without the
    #: configured key, not a URL): a final failure, never "still processing".
    output_problem: str | None = None
    #: The provider's failure message (redacted), if it failed.
    error: str | None = None
    #: When the provider says the job was made (ISO 8601), for adoption after a lost reply.
    created_at: str | None = None
    #: The input the provider holds for this job (from listings; ``None`` once the
    #: provider's retention removed it or the kind does not show it).
    input: dict[str, Any] | None = None
    #: The model (``owner/name``) or version the job runs.
    model: str | None = None
    #: Whether the provider keeps the job queued for its own limits (Runway ``THROTTLED``):
    #: that time does not count against the attempt's deadline.
    throttled: bool = False

    @property
    def final(self) -> bool:
        return self.status in FINAL


class Lookup(msgspec.Struct, kw_only=True):
    """What a provider's listing says about the window since an intent (:meth:`Provider.find`).

    ``matches``: jobs of the window whose model and input are the frozen ones;
    ``unknown``: jobs in the window whose input the listing no longer shows
    (retention, or another kind of job): they could be the one the create made.
    ``covered``: the listing was read back past the window's start. ``why``: what
    kept it from being covered (or from being read at all: ``supported`` false).
    """

    supported: bool = True
    matches: list[RemoteJob] = []
    unknown: list[RemoteJob] = []
    covered: bool = False
    searched: int = 0
    pages: int = 0
    why: str = ""


class Downloaded(msgspec.Struct, kw_only=True):
    """A verified download: the byte count and hash of what is now at ``path``."""

    path: str
    size: int
    sha256: str
    #: Whether the provider sent a checksum that was checked (``Content-Digest``).
    checksum_checked: bool = False
    content_type: str | None = None
    seconds: float = 0.0


# -- pure helpers --------------------------------------------------------------


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (milliseconds, as OpenAI-style APIs send)
    or ``Retry-After`` (delta-seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms.strip()) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
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


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or ""), parts.port


def pick_video(output: Any, key: str | None) -> tuple[str | None, str | None]:
    """The video URL in a model's output, by the documented rule -> (url, problem).

    A string is the URL; a list gives its first string; an object gives the value
    under ``key`` (``[providers.<name>] output_key``), itself by the same rule. Anything
    else (empty, an object without the key, not an http(s) URL) is a problem, stated.
    """
    if isinstance(output, str):
        if output.startswith(("https://", "http://")):
            return output, None
        return None, f"the output {_short(output)} is not a URL"
    if isinstance(output, list):
        if not output:
            return None, "the output is an empty list"
        first = next((o for o in output if isinstance(o, str)), None)
        if first is None:
            return None, f"the output list holds no URL ({_short(output)})"
        return pick_video(first, None)
    if isinstance(output, dict):
        if key is None:
            return None, (
                f"the output is an object ({_short(output)}); name the key that holds the video "
                "with output_key in the provider's table"
            )
        if key not in output:
            return None, f"the output object has no key {key!r} ({_short(output)})"
        return pick_video(output[key], None)
    if output is None:
        return None, "the provider reported success without an output"
    return None, f"the output {_short(output)} is not a URL"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- the contract ----------------------------------------------------------------


class Provider(ABC):
    """What a provider kind implements. One instance per ``[providers.<name>]``."""

    #: The kind's name in ``[providers.<name>] kind`` and the entry-point group.
    kind: str = ""
    #: Whether ``find`` can list the provider's jobs (and so may prove a create made nothing).
    can_find: bool = False
    #: Whether a 429 on create means the daily quota is spent (Runway), not a brief throttle.
    quota_on_create_429: bool = False
    #: Whether ``cancel`` of a finished job deletes its result (Runway's ``DELETE``): the
    #: caller then looks at the job first, and never cancels one that finished.
    cancel_deletes: bool = False

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.name = config.name
        #: What this client did, for the daemon's metrics: ``call.<operation>``
        #: (requests sent), ``error.<code>`` (each :class:`ProviderError`), ``bytes``
        #: (downloaded and verified). Only ever grows.
        self.counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        #: The provider's clock minus ours, from its ``Date`` header (``None``: not seen yet).
        self.clock_offset: float | None = None

    def count(self, what: str, n: int = 1) -> None:
        with self._counts_lock:
            self.counts[what] += n

    def counted(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self.counts)

    @abstractmethod
    def create(self, model: str, input: dict[str, Any], key: str) -> RemoteJob:
        """Start a generation; ``key`` is spool's idempotency key (job + attempt)."""

    def describe_create(self, model: str, input: dict[str, Any]) -> str:
        """What a create request for ``model`` sends, for the create log (no input, no token)."""
        return f"create {model}"

    @abstractmethod
    def get(self, job_id: str) -> RemoteJob:
        """The generation's state now (and fresh output URLs, where the provider signs them)."""

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Ask the provider to stop (and stop charging for) a generation."""

    @abstractmethod
    def find(self, model: str, input: dict[str, Any], since: datetime) -> Lookup:
        """Every job made at or after ``since`` whose input may be this one (see :class:`Lookup`)."""

    @abstractmethod
    def download(
        self, url: str, dest: Path, *, abort: Abort | None = None, until: float | None = None
    ) -> Downloaded:
        """Stream ``url`` into ``dest`` while hashing, within the transfer limits."""

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
        # A read waits at most `stall` seconds: a silent server is a stalled download.
        dl = config.download
        self._downloads = httpx.Client(
            timeout=httpx.Timeout(min(dl.stall, dl.timeout), connect=min(10.0, dl.timeout)),
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
        """``text`` safe to keep: the token masked even if spool.core.secrets was never told of it."""
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

    def _clock(self, resp: httpx.Response) -> None:
        date = resp.headers.get("date")
        if not date:
            return
        try:
            theirs = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return
        self.clock_offset = theirs - time.time()

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
            # Nothing was sent: safe to send again, even a create.
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
                code="transit",
            ) from None
        self._clock(resp)
        if resp.status_code >= 400:
            outcome, code = classify_status(resp.status_code)
            if creates and code == "server_error":
                outcome = "ambiguous"  # a gateway's 5xx can follow a create the backend did make
            if creates and code == "rate_limited" and self.quota_on_create_429:
                code = "quota"
            retry_after = parse_retry_after(resp.headers)
            next_action = {
                "unauthorized": f"check the token in the environment variable {self.config.token_env}",
                "lost": "the provider does not know this job",
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
    def download(
        self, url: str, dest: Path, *, abort: Abort | None = None, until: float | None = None
    ) -> Downloaded:
        """Stream ``url`` into ``dest`` (created or truncated) while hashing.

        Limits: the whole transfer ends by ``download.timeout`` seconds (or ``until``,
        epoch seconds, if sooner); a transfer slower than ``download.min_rate`` over
        ``download.stall`` seconds, or silent that long, is stalled; ``abort`` stops it
        from another thread within a second. Checked, in order: the HTTP status
        (401/403/404/410: the URL expired or is gone, ``expired``), ``download.max_bytes``
        (final), the ``Content-Length`` against the bytes received (truncated), and the
        provider's ``Content-Digest`` sha-256 (mismatch). The bytes go to a hidden
        ``.<name>.part`` beside ``dest``, fsynced, and take ``dest``'s name only once every
        check passed: a file at ``dest`` is always a whole, checked download (recovery may
        publish it after the gate), and a partial one is removed on any failure.
        """
        op = "download"
        final, dest = dest, dest.with_name(f".{dest.name}.part")
        dl = self.config.download
        limit = dl.max_bytes_int
        digest = hashlib.sha256()
        size = 0
        started = time.monotonic()
        end = started + dl.timeout
        if until is not None:
            end = min(end, started + max(0.0, until - time.time()))
        window: deque[tuple[float, int]] = deque()  # (when, size so far) over the last `stall` s
        min_bytes = dl.min_rate_int * dl.stall
        headers = {"Accept-Encoding": "identity"}
        if origin(url) == origin(self.config.base_url):
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            if time.monotonic() >= end:
                raise self._stalled(0, "the time left for it ran out before it began", code="timeout")
            with self._downloads.stream("GET", url, headers=headers) as resp:
                if abort is not None:
                    abort.bind(_shutdown_of(resp))
                if resp.status_code in (401, 403, 404, 410):
                    raise self.error(
                        op,
                        f"of the output answered HTTP {resp.status_code}: the output URL has expired or gone",
                        outcome="final",
                        code="expired",
                        http_status=resp.status_code,
                    )
                if resp.status_code >= 400:
                    outcome, code = classify_status(resp.status_code)
                    raise self.error(
                        op,
                        f"of the output answered HTTP {resp.status_code}",
                        outcome="retryable" if code in ("rate_limited", "server_error") else outcome,
                        code=code,
                        http_status=resp.status_code,
                        retry_after=parse_retry_after(resp.headers),
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
                # No chunk size: each read is seen as it arrives (the rate is judged per read).
                chunks = resp.iter_bytes() if encoded else resp.iter_raw()
                window.append((time.monotonic(), 0))
                with open(dest, "wb") as f:
                    for chunk in chunks:
                        if abort is not None and abort.reason is not None:
                            break
                        size += len(chunk)
                        if size > limit:
                            raise self._too_large(size, limit)
                        digest.update(chunk)
                        f.write(chunk)
                        now = time.monotonic()
                        if now >= end:
                            raise self._stalled(
                                size, f"did not finish within {dl.timeout:g} s", code="timeout"
                            )
                        window.append((now, size))
                        while len(window) > 1 and window[1][0] <= now - dl.stall:
                            window.popleft()
                        t0, s0 = window[0]
                        if now - t0 >= dl.stall and size - s0 < min_bytes:
                            raise self._stalled(
                                size,
                                f"was slower than download.min_rate ({size - s0} bytes in the last "
                                f"{now - t0:.0f} s)",
                            )
                    if abort is not None and abort.reason is not None:
                        raise self._aborted(abort, size)
                    f.flush()
                    os.fsync(f.fileno())
                if declared is not None and declared.isdigit() and size != int(declared):
                    raise self._truncated(size, int(declared))
                got = digest.hexdigest()
                if stated is not None and stated != got:
                    raise self.error(
                        op,
                        f"checksum mismatch: the provider's Content-Digest sha-256 is {stated[:16]}…, "
                        f"the bytes received hash to {got[:16]}…",
                        outcome="retryable",
                        code="checksum",
                    )
                os.replace(dest, final)
                self.count("bytes", size)
                return Downloaded(
                    path=str(final),
                    size=size,
                    sha256=got,
                    checksum_checked=stated is not None,
                    content_type=resp.headers.get("content-type"),
                    seconds=time.monotonic() - started,
                )
        except ProviderError:
            _unlink(dest)
            raise
        except (httpx.HTTPError, OSError) as exc:
            _unlink(dest)
            if abort is not None and abort.reason is not None:
                raise self._aborted(abort, size) from None
            if isinstance(exc, OSError):
                raise  # the local disk (full, read-only): the caller's kind of trouble
            if isinstance(exc, httpx.TimeoutException):
                raise self._stalled(size, f"got no byte for {dl.stall:g} s", code="stalled") from None
            if isinstance(exc, httpx.RemoteProtocolError):
                # The server closed the connection before the declared length: truncated.
                raise self.error(
                    op, f"was cut off after {size} bytes ({exc})", outcome="retryable", code="truncated"
                ) from None
            raise self.error(
                op, f"failed after {size} bytes ({type(exc).__name__})", outcome="retryable", code="http"
            ) from None
        except BaseException:
            _unlink(dest)
            raise
        finally:
            if abort is not None:
                abort.bind(None)

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
        )

    def _stalled(self, size: int, why: str, *, code: str = "stalled") -> ProviderError:
        return self.error("download", f"{why} after {size} bytes", outcome="retryable", code=code)

    def _aborted(self, abort: Abort, size: int) -> ProviderError:
        return self.error(
            "download", f"was stopped after {size} bytes: {abort.reason}", outcome="final", code="aborted"
        )


def _shutdown_of(resp: httpx.Response) -> Callable[[], None] | None:
    """A callable that makes a read blocked on ``resp``'s socket return at once."""
    stream = resp.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if not isinstance(sock, socket.socket):
        return None
    return lambda: sock.shutdown(socket.SHUT_RDWR)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
