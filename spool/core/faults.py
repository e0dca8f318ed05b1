"""Named crash points, for proving crash safety with real SIGKILLs.

With ``SPOOL_CRASH_AT=<name>`` in its environment, a process kills itself
with SIGKILL the first time it reaches that point: no cleanup, no finally
blocks, exactly like the OOM killer or a power cut for everything not yet
fsynced. The torture harness and the crash-point tests set it; in normal
runs each call is one comparison.
"""

from __future__ import annotations

import os
import signal

#: Every crash point, in the order a render passes them.
POINTS = (
    "after_claim",
    "after_attempt_dir",
    "mid_render",
    "after_validation",
    "after_store_link",
    "after_result",
    "after_manifest",
    "mid_index",
    "after_index",
    "before_complete_rename",
)


#: Crash points off a render's path, each proved by a test of its own.
OTHER_POINTS = (
    "after_quarantine_reason",
    "after_blocklist",
    "after_takeover",  # a recoverer took another worker's job over (the rename), decided nothing yet
    # A generation's attempt, between its durable states (spool.kinds.generate):
    "after_gen_intent",
    "after_gen_inherit_begin",  # an heir's intent durable (with the job it inherits), not yet generating
    "after_gen_create_logged",  # create request k durable in the create log, not yet sent
    "after_gen_create",  # the provider made the job; its ID is only in the create log
    "after_gen_ledger",  # the provider job entered in the ledger, the attempt not yet generating
    "after_gen_generating",
    "after_gen_retrieving",
    "after_gen_stored",
    "after_gen_indexed",
    # Group commit (spool.disk.groupcommit): job files of an acceptance batch written, their
    # folders not fsynced and the drops kept; and between the folder fsyncs of a batch.
    "mid_accept_batch",
    "mid_accept_claims",  # drops accepted and claimed in one batch (format 2), nothing fsynced or told
    "after_job_file",  # an accepted job file written, its frozen copy attempts/J/job.json not yet
    "mid_group_sync",
    # Adoption (spool.library.adopt): a file's adopt job accepted, not yet claimed.
    "mid_adopt",
    # Dependencies (spool.queue.depends): a dependent frozen in waiting/, not yet moved to pending/;
    # its hold record written, the job not yet moved to held/.
    "after_resolve_write",
    "after_hold_record",
    # Format 2 (issue 25): a publish batch with some jobs moved to complete/, the rest not
    # yet; the library index's segments merged into entries (durable) but not yet removed,
    # or compacted into one (durable) with the old ones not yet removed.
    "mid_complete_batch",
    "mid_index_merge",
    "mid_index_compact",
    # spool migrate (spool.repair.migrate): format 2's merged entries durable, the format 1
    # records they replace not yet removed.
    "mid_migrate",
)


#: The crash point this process dies at, read once: a process is started with it (the
#: torture harness and the tests set it in a child's environment, never later), and a
#: job passes ~20 points, where os.environ's lookup (a key encoded each time) showed.
_AT = os.environ.get("SPOOL_CRASH_AT")


def armed(name: str) -> bool:
    """Whether this process is to die at crash point ``name`` (for a step that must take
    a slower path to make the point reachable at all, like a batch's concurrent fsyncs)."""
    return name == _AT


def crashpoint(name: str) -> None:
    """Die here, now, if the environment asks for it."""
    if name == _AT:
        os.kill(os.getpid(), signal.SIGKILL)
