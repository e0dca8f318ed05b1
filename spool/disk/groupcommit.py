"""Group commit: folder fsyncs that several jobs need at once are done once, together.

A daemon with several slots moves many jobs through the same folders
(``complete/``, ``running/<worker>/``, ``manifests/``, ``pending/``...). Each
move is durable only once its folder is fsynced, but one fsync of a folder
makes *every* entry changed in it before the fsync began durable. So:

* **Across threads** (:class:`Coalescer`, installed by the daemon): threads
  asking to fsync the same folder share one fsync, leader and followers. The
  rule that keeps it correct: a request is satisfied only by an fsync that
  *started after* the request was made (the request's ticket is the number of
  the next fsync to start on that folder), so whatever the requester changed
  before asking is covered. While an fsync runs, newcomers queue for the next
  one; its leader takes them all. A leader waits at most ``window`` seconds
  for company, and only while other threads are inside the syncer and may be
  on their way: a lone request (nothing else in flight) is never delayed.
* **Within one thread** (:func:`together`): a batch (accepting many drops,
  claiming into several free slots) records the folders it would fsync and
  fsyncs each once when the batch ends, in the order first asked. The caller
  tells nobody anything (journal line, command return, next state) before the
  batch ends: that is the caller's half of the promise.

Never ``syncfs``/``sync``: they would flush a concurrent render's gigabytes on
the same disk. A folder fsync here is the same ``fsync(2)`` as before; only how
many are issued changes. The module does not know the spool tree:
:func:`spool.disk.tree.fsync_dir` routes every folder fsync through :func:`sync_folder`.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from spool.core.faults import armed, crashpoint
from spool.disk.tree import (
    commit_riders,
    fsync_folder_now,
    ride_folder_fsyncs,
    riding,
    route_folder_fsyncs,
    stop_riding,
)

#: How long a leader waits, at most, for other threads' requests on its folder (seconds).
WINDOW = 0.002


class _Folder:
    """One folder's fsync sequence: ``started`` and ``done`` count fsyncs, in order
    (one runs at a time per folder, so they complete in the order they start)."""

    __slots__ = ("busy", "done", "started", "waiting")

    def __init__(self) -> None:
        self.started = 0
        self.done = 0
        self.busy = False
        self.waiting = 0


class Coalescer:
    """Shares folder fsyncs between threads (see the module docstring).

    ``calls`` counts the fsyncs issued and ``requests`` the fsyncs asked for:
    the difference is what group commit saved. ``fsync`` is the call that does
    the work (tests wrap the real one to watch it).
    """

    def __init__(self, window: float = WINDOW, fsync: Callable[[str], None] = fsync_folder_now) -> None:
        self.window = window
        self._fsync = fsync
        self._cond = threading.Condition()
        self._folders: dict[str, _Folder] = {}
        self._inside = 0  # threads inside sync()
        self._windowing = 0  # leaders waiting out their window
        self.calls = 0
        self.requests = 0

    def sync(self, folder: str | os.PathLike[str], *, wait_for_company: bool = True) -> None:
        """Return once an fsync of ``folder`` that began after this call has completed.

        ``wait_for_company=False``: a leader fsyncs at once (the fsyncs of an
        :func:`together` batch issued at once: the others in flight are its own)."""
        key = os.fspath(folder)
        cond = self._cond
        with cond:
            st = self._folders.get(key)
            if st is None:
                st = self._folders[key] = _Folder()
            ticket = st.started + 1  # only an fsync that starts from now on will do
            st.waiting += 1
            self._inside += 1
            self.requests += 1
            cond.notify_all()  # a leader waiting for company may have it now
            try:
                while st.done < ticket:
                    if st.busy:
                        cond.wait()
                        continue
                    self._lead(key, st, self.window if wait_for_company else 0.0)
            finally:
                st.waiting -= 1
                self._inside -= 1
                if st.waiting == 0 and not st.busy:
                    del self._folders[key]  # nobody holds a ticket: forget it (bounded memory)
                cond.notify_all()

    def _lead(self, key: str, st: _Folder, window: float) -> None:
        """Called with the lock held: wait (bounded) for company, then fsync for all."""
        cond = self._cond
        st.busy = True
        try:
            deadline = time.monotonic() + window
            self._windowing += 1
            try:
                while self._others(st) > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    cond.wait(left)
            finally:
                self._windowing -= 1
            st.started += 1
            gen = st.started
            cond.release()
            try:
                self._fsync(key)
            finally:
                cond.acquire()
            self.calls += 1
            st.done = gen  # only on success: after an error a follower leads and retries
        finally:
            st.busy = False
            cond.notify_all()

    def _others(self, st: _Folder) -> int:
        """Threads in the syncer right now that might still come to this folder: neither
        queued here nor leaders waiting out a window of their own elsewhere. Only
        threads already in flight count (a guess about threads busy elsewhere cost
        every lone job the whole window), so a lone request never waits."""
        return self._inside - st.waiting - (self._windowing - 1)


_installed: Coalescer | None = None
_local = threading.local()


def install(coalescer: Coalescer | None) -> None:
    """Route this process's folder fsyncs through ``coalescer`` (``None``: plain fsyncs).

    The daemon installs one; the CLI (one job at a time) never does.
    """
    global _installed
    _installed = coalescer
    route_folder_fsyncs(sync_folder)


def installed() -> Coalescer | None:
    return _installed


def sync_folder(folder: str | os.PathLike[str], after: str | os.PathLike[str] | None = None) -> None:
    """Make ``folder``'s entries durable: at once, or at the end of this thread's
    :func:`together` batch, through the installed coalescer if there is one.

    ``after``: a folder whose fsync must complete first (a move's source folder is
    fsynced after its destination's, so the new name is durable before the old
    one's removal is); a batch keeps that order even when it fsyncs at once.

    The riders (the journals, :func:`spool.disk.tree.ride_folder_fsyncs`) are committed
    first; a batch commits them when it ends, beside its first folder fsyncs."""
    pending: dict[str, set[str]] | None = getattr(_local, "pending", None)
    if pending is not None:
        sources: dict[str, None] | None = getattr(_local, "sources", None)
        if after is not None and sources is not None:
            sources[os.fspath(folder)] = None  # a move's source: owed once the batch ends
            return
        deps = pending.setdefault(os.fspath(folder), set())
        if after is not None and os.fspath(after) != os.fspath(folder):
            deps.add(os.fspath(after))
        return
    if riding():
        commit_riders()
    _sync_now(os.fspath(folder))


def _sync_now(folder: str, wait_for_company: bool = True) -> None:
    c = _installed
    if c is None:
        fsync_folder_now(folder)
    else:
        c.sync(folder, wait_for_company=wait_for_company)


class Owed:
    """Folders whose fsync may wait for this process's next one: the source folders of a
    publish batch's moves to ``complete/`` (``together(sources_later=True)``).

    A rider (:func:`spool.disk.tree.ride_folder_fsyncs`), like the journals: paid by the
    next folder fsync of any thread, inside the next batch's first round (where a claim
    batch asks for the same ``running/<worker>/`` anyway: one fsync for both), or by
    :func:`spool.disk.tree.commit_riders` (a command's end, an idle daemon's step, its
    heartbeat and stop). What waits is only the old name's removal: the new name was
    durable first, so a cut in between leaves the job's file under both names, which
    recovery (:func:`spool.repair.recover.recover`: the old name of a complete job goes,
    nothing is decided or told again) and ``spool fsck`` (keep ``complete``) resolve; a
    cut between two rounds of one batch left the same."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._folders: dict[str, None] = {}

    def add(self, folder: str) -> None:
        with self._lock:
            self._folders[folder] = None
            ride_folder_fsyncs(self)

    def take(self) -> list[str]:
        """The folders owed, now the caller's to fsync."""
        with self._lock:
            out, self._folders = list(self._folders), {}
            stop_riding(self)
        return out

    def commit(self) -> None:
        folders = self.take()
        try:
            for folder in folders:
                _sync_owed(folder)
        except OSError:
            for folder in folders:
                self.add(folder)  # still owed: the next commit tries again, and raises
            raise


def _sync_owed(folder: str) -> None:
    """An owed folder's fsync, at once (never waiting for company: it is issued beside a
    round's, or alone); one removed meanwhile (an emptied ``running/<host>-adopt/``) has
    no entries left to make durable."""
    try:
        _sync_now(folder, wait_for_company=False)
    except FileNotFoundError:
        pass


#: This process's owed folders.
owed = Owed()


@contextmanager
def together(*, at_once: bool = False, threads: int = 0, sources_later: bool = False) -> Iterator[None]:
    """A batch: this thread's folder fsyncs inside are done once each when it ends.

    Nothing made inside may be told to anyone before the block ends (the fsyncs
    have not happened yet). Nested blocks join the outer one. On an exception
    the fsyncs are still done (what was written stays as durable as it would
    have been), and a failing fsync then does not hide the first error.

    The fsyncs run in the order first asked; ``at_once=True`` runs them at the
    same time instead (one thread each), in rounds that keep every order asked
    for (``after``: a move's source after its destination): the filesystem then
    commits each round's together (ext4 and XFS merge concurrent fsyncs into one
    journal commit), one wait per round instead of one per folder. The number of
    fsyncs is the same. ``threads`` bounds how many run at once (0: one thread
    per folder; a merge of the library index touches hundreds).

    ``sources_later=True``: a move's source folder (asked with ``after``) is not fsynced
    by this batch but owed (:class:`Owed`), paid by this process's next folder fsync; only
    a publish batch's moves to ``complete/`` ask it (the job is told complete once its new
    name is durable). Any owed folders are paid in a batch's first round.

    The riders' lines (the journals) were all written before the batch began and
    tell only what earlier fsyncs made durable, so they need no order against the
    batch's folders: they are committed beside the first round, not before it (one
    wait fewer a batch; a cut in between may take them, and fsck rebuilds a lost line
    from the tree).
    """
    if getattr(_local, "pending", None) is not None:
        yield
        return
    route_folder_fsyncs(sync_folder)  # from now on, this process's folder fsyncs come here
    pending: dict[str, set[str]] = {}
    _local.pending = pending
    sources: dict[str, None] | None = {} if sources_later else None
    _local.sources = sources
    ok = False
    try:
        yield
        ok = True
    finally:
        _local.pending = None
        _local.sources = None
        # Owed folders are paid in this batch's first round; one the batch fsyncs anyway, once.
        owed_now = [f for f in owed.take() if f not in pending] if pending else []
        try:
            riders = riding() and bool(pending)
            if at_once and len(pending) > 1:
                order = rounds(pending)
                if len(order) == 1 and armed("mid_group_sync"):
                    # One round has no "between": under this crash point only, its first
                    # folder goes alone, so a test can cut the batch half-durable.
                    order = [order[0][:1], order[0][1:]]
                for k, batch in enumerate(order):
                    if k == 1:
                        crashpoint("mid_group_sync")  # some folders of the batch durable, the rest not
                    beside = owed_now if k == 0 else []
                    _sync_all_at_once(batch, threads, with_riders=riders and k == 0, owed_folders=beside)
            else:
                for n, folder in enumerate(pending):
                    if n == 1:
                        crashpoint("mid_group_sync")  # some folders of the batch durable, the rest not
                    if n == 0 and (riders or owed_now):
                        _sync_all_at_once(
                            [folder], with_riders=riders, wait_for_company=True, owed_folders=owed_now
                        )
                    else:
                        _sync_now(folder)
        except OSError:
            for folder in owed_now:
                owed.add(folder)  # maybe not paid: still owed (the next fsync tries again)
            if ok:
                raise
        finally:
            for folder in sources or ():
                owed.add(folder)  # after this batch's rounds: its new names durable first


def commit_riders_soon() -> None:
    """Start making the riders' lines (the journals) durable now, on a helper thread, and
    return at once. For lines just told of a batch: the next batch's first round then
    finds them durable, or waits for this fsync and shares it (a journal's commits
    share), instead of starting its own there; the wait overlaps the work between the
    two batches (a claim after an acceptance: ~1 ms a drop-to-claim on ext4, where a
    file's fsync costs ~4 folder fsyncs). The promise is unchanged: lines are durable no
    later than the writer's next folder fsync. An error is left for that commit to raise."""
    if riding():
        _helpers().submit(_commit_riders_quietly)


def _commit_riders_quietly() -> None:
    try:
        commit_riders()
    except OSError:
        pass  # the lines stay not durable: the next commit (a batch's, a heartbeat's) raises


def rounds(deps: dict[str, set[str]]) -> list[list[str]]:
    """Folders in rounds, each after every folder it must follow (pure; a cycle, which
    no caller makes, falls back to the order first asked, one folder a round)."""
    out: list[list[str]] = []
    done: set[str] = set()
    left = list(deps)
    while left:
        ready = [f for f in left if deps[f] <= done or not (deps[f] & set(left))]
        if not ready:
            ready = left[:1]
        out.append(ready)
        done |= set(ready)
        left = [f for f in left if f not in done]
    return out


#: Helper threads kept for :func:`_sync_all_at_once` (started on first use, then reused:
#: starting a thread per folder per batch cost ~0.2 ms a thread on the job path).
HELPERS = 32
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=HELPERS, thread_name_prefix="fsync")
        return _pool


def _sync_all_at_once(
    folders: list[str],
    threads: int = 0,
    *,
    with_riders: bool = False,
    wait_for_company: bool = False,
    owed_folders: Sequence[str] = (),
) -> None:
    """fsync every folder concurrently (the first on this thread, the rest on helper
    threads; ``threads`` > 0: at most that many at a time); the first error is raised.
    ``with_riders``: commit the riders (the journals) beside them, as one more task;
    ``owed_folders``: folders :data:`owed` handed over, fsynced beside them too.

    The caller takes tasks from the same list as its helpers, so it never waits on a
    helper that has not started: it cancels those (busy helpers mean fewer at once,
    never a stall)."""
    errors: list[OSError] = []
    todo: list[Callable[[], None]] = [
        functools.partial(_sync_now, f, wait_for_company=wait_for_company) for f in reversed(folders)
    ]
    todo += [functools.partial(_sync_owed, f) for f in owed_folders]
    if with_riders:
        todo.append(commit_riders)  # popped first: this thread starts on it, helpers on the folders
    lock = threading.Lock()

    def run() -> None:
        while True:
            with lock:
                if not todo:
                    return
                task = todo.pop()
            try:
                task()
            except OSError as exc:
                errors.append(exc)

    n = len(todo) if threads <= 0 else min(threads, len(todo))
    n = min(n, HELPERS + 1)
    pool = _helpers() if n > 1 else None
    started = [pool.submit(run) for _ in range(n - 1)] if pool is not None else []
    run()
    for f in started:
        if not f.cancel():
            f.result()
    if errors:
        raise errors[0]
