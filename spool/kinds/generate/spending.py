"""The spending guard: at most N create requests per provider per rolling hour and day.

A flood of jobs or a bug must not burn a provider account, whichever process
or host sends the requests. The guard keeps one file per create request in
the spool tree::

    SPOOL/providers/<name>/submissions/<UTC time>-<host>-<pid>-<random>.json

and counts them by listing the folder (a scan of names, no file is read).
Nothing is ever read, modified and written back, so no lock is needed and the
count survives restarts and works across processes and NAS clients.

Protocol of :func:`reserve` (write first, count second, back out if over):

1. write this request's file (atomically, durably);
2. list the folder and count the files of the last hour and the last day;
3. if either count exceeds its limit, remove this file and refuse.

This never admits more than the limit: of any ``limit + 1`` admitted files,
the last one written saw all the others when it counted (admitted files are
never removed), so it would have refused. Racing contenders can both refuse
(never both overspend); a refused request simply waits. Hosts' clocks name
the files, so skew between hosts shifts the windows by that skew.

A reservation whose request certainly never reached the provider (connection
refused, HTTP 429) may be :func:`release`d; everything else stays counted.
Files older than two days are removed by the next reservation.

:func:`allowance` is how the daemon keeps a refused job *waiting* instead of
failing it: before it claims a provider's jobs it asks how many creates the
windows still allow and when the next one frees up, and claims no more than
that (in submission order, as the claim order goes). A refusal at
:func:`reserve` then only happens to a race between hosts; that attempt ends
without a create and its job waits in ``pending/`` like the others.
"""

from __future__ import annotations

import bisect
import os
import re
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from spool.core.errors import SpoolError
from spool.core.model import encode
from spool.disk.tree import HOST, make_dirs, visible_names, write_atomic

HOUR = 3600.0
DAY = 86400.0
#: Files older than this are removed (well past the day window).
KEEP = 2 * DAY

_NAME = re.compile(r"^(?P<ts>\d{8}T\d{6}\.\d{6}Z)-")


class CreateCounted(msgspec.Struct, kw_only=True):
    """One create request that was (or is about to be) sent to a provider, counted against
    the allowance (``providers/<name>/submissions/<stamp>-...json``)."""

    provider: str
    job: str
    key: str
    at: str
    host: str
    pid: int


class SpendingRefused(SpoolError):
    """A create would exceed ``[providers.<name>] spending``; ``retry_at`` is when it would not."""

    def __init__(self, provider: str, reason: str, retry_at: float) -> None:
        self.provider = provider
        self.reason = reason
        self.retry_at = retry_at
        super().__init__(reason)


def folder(root: Path, provider: str) -> Path:
    return Path(root) / "providers" / provider / "submissions"


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def _parse(name: str) -> float | None:
    m = _NAME.match(name)
    if not m:
        return None
    return datetime.strptime(m.group("ts"), "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC).timestamp()


def times(root: Path, provider: str) -> list[tuple[float, str]]:
    """``(time, name)`` of every recorded create request, oldest first."""
    out = []
    for name in visible_names(folder(root, provider)):
        t = _parse(name)
        if t is not None:
            out.append((t, name))
    out.sort()
    return out


def count(root: Path, provider: str, now: float | None = None) -> tuple[int, int]:
    """Create requests recorded in the last hour and the last day."""
    now = time.time() if now is None else now
    ts = [t for t, _ in times(root, provider)]
    return sum(1 for t in ts if now - HOUR < t <= now + HOUR), sum(
        1 for t in ts if now - DAY < t <= now + HOUR
    )


def _refusal(
    provider: str, field: str, limit: int, window: float, seen: list[float], where: Path
) -> SpendingRefused:
    """The refusal for ``seen`` (times of the other requests in ``window``, oldest first)."""
    span = "hour" if window == HOUR else "day"
    if limit == 0:
        retry_at = float("inf")
        when = "no create is allowed until the limit is raised"
    else:
        # Room appears when enough of the oldest have left the window.
        retry_at = seen[len(seen) - limit] + window
        when = f"the next is allowed at {datetime.fromtimestamp(retry_at, UTC):%Y-%m-%d %H:%M:%S} UTC"
    reason = (
        f"[providers.{provider}] spending.{field} = {limit}: {len(seen)} create "
        f"request{'' if len(seen) == 1 else 's'} in the last {span} (one file each in {where}); {when}"
    )
    return SpendingRefused(provider, reason, retry_at)


class Allowance(msgspec.Struct, kw_only=True):
    """What the spending windows allow now: ``room`` more create requests; when none,
    ``frees_at`` (epoch seconds; ``inf`` for a limit of 0) and ``reason``."""

    room: int
    frees_at: float | None = None
    reason: str = ""
    #: The (per_hour, per_day) limits it was counted against.
    limits: tuple[int, int] = (0, 0)


def allowance(root: Path, provider: str, per_hour: int, per_day: int, now: float | None = None) -> Allowance:
    """How many more create requests the hour and day windows allow (one listing).

    Counted by name, as :func:`reserve` counts (the UTC stamps sort as text): a
    window is a bisection of the sorted names; only the names a refusal quotes
    are parsed (10,000 requests in a day cost one listing and two bisections)."""
    now = time.time() if now is None else now
    names = sorted(n for n in visible_names(folder(root, provider)) if _NAME.match(n))
    upper = bisect.bisect_right(names, _stamp(now + HOUR) + "~")
    room = None
    tightest: SpendingRefused | None = None
    for field, limit, window in (("per_hour", per_hour, HOUR), ("per_day", per_day, DAY)):
        lower = bisect.bisect_right(names, _stamp(now - window) + "~", 0, upper)
        left = limit - (upper - lower)
        room = left if room is None else min(room, left)
        if left <= 0:
            seen = [t for n in names[lower:upper] if (t := _parse(n)) is not None]
            r = _refusal(provider, field, limit, window, seen, folder(root, provider))
            if tightest is None or r.retry_at > tightest.retry_at:
                tightest = r
    room = max(0, room or 0)
    if room > 0 or tightest is None:
        return Allowance(room=room, limits=(per_hour, per_day))
    return Allowance(room=0, frees_at=tightest.retry_at, reason=tightest.reason, limits=(per_hour, per_day))


def reserve(
    root: Path,
    provider: str,
    per_hour: int,
    per_day: int,
    *,
    job: str,
    key: str,
    now: float | None = None,
) -> Path:
    """Record a create request about to be sent, or raise :class:`SpendingRefused`.

    Returns the reservation's path (for :func:`release`). Call it before the
    request, after the attempt's intent record is durable.
    """
    where = folder(root, provider)
    now = time.time() if now is None else now
    for field, limit, window in (("per_hour", per_hour, HOUR), ("per_day", per_day, DAY)):
        if limit == 0:
            raise _refusal(provider, field, 0, window, [], where)
    make_dirs(where)
    name = f"{_stamp(now)}-{HOST}-{os.getpid()}-{secrets.token_hex(4)}.json"
    mine = where / name
    record = CreateCounted(provider=provider, job=job, key=key, at=_stamp(now), host=HOST, pid=os.getpid())
    write_atomic(mine, encode(record), replace=False)
    # Counted by name: the UTC stamps sort as text, so a window is two string
    # comparisons per file and no date is parsed (thousands of creates each list
    # thousands of files: parsing them all made admission quadratic in CPU).
    names = [n for n in visible_names(where) if _NAME.match(n)]
    upper = _stamp(now + HOUR) + "~"  # "~" sorts after the rest of any name with that stamp
    for field, limit, window in (("per_hour", per_hour, HOUR), ("per_day", per_day, DAY)):
        lower = _stamp(now - window) + "~"
        inside = sum(1 for n in names if lower < n <= upper)
        if inside > limit:
            release(mine)
            others = sorted(
                t for t, n in times(root, provider) if now - window < t <= now + HOUR and n != name
            )
            raise _refusal(provider, field, limit, window, others, where)
    oldest = _stamp(now - KEEP)
    for n in names:
        if n < oldest:
            release(where / n)
    return mine


def release(path: Path) -> None:
    """Forget a reservation whose request certainly never reached the provider."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
