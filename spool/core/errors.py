"""Errors a user or script sees, each carrying the CLI exit code of SPEC section 10.

Messages are one sentence that names the field or file and the problem.
"""

from __future__ import annotations

#: Exit codes of the CLI's machine interface.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INVALID = 2
EXIT_NOT_READY = 3
EXIT_NOT_FOUND = 4


class SpoolError(Exception):
    """Anything the CLI reports as one line; ``exit_code`` says how."""

    exit_code = EXIT_ERROR


class InvalidInput(SpoolError):
    """A submission, recipe, argument or config value is not acceptable."""

    exit_code = EXIT_INVALID

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class ConfigError(InvalidInput):
    """``spool.toml`` is unreadable or a key has a bad value."""


class NotReady(SpoolError):
    exit_code = EXIT_NOT_READY


class NotFound(SpoolError):
    exit_code = EXIT_NOT_FOUND


class LostOwnership(SpoolError):
    """This worker no longer owns the job (it was recovered elsewhere): the
    fencing check at a commit point failed, so nothing may be published."""


class Failed(Exception):
    """A located failure of one attempt: what its failure record will say.

    Raised by a kind while producing or checking a candidate, and by the publish
    path; :mod:`spool.queue.execute` writes the record and moves the job (to
    ``failed/``, back to ``pending/`` when ``retryable`` and attempts remain, or on
    to another worker when ``fault`` is ``"host"``).
    """

    def __init__(
        self,
        stage: str,
        prop: str,
        message: str,
        *,
        expected: object = None,
        actual: object = None,
        log_excerpt: list[str] | None = None,
        next_action: str,
        retryable: bool = False,
        fault: str = "job",
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.property = prop
        self.message = message
        self.expected = expected
        self.actual = actual
        self.log_excerpt = list(log_excerpt or [])
        self.next_action = next_action
        self.retryable = retryable
        self.fault = fault


class Interrupted(Exception):
    """The daemon is stopping: the attempt ends as interrupted, the job returns to pending."""


class Deferred(Exception):
    """The attempt ends having done nothing that costs or counts (a provider's quota is
    spent, a spending allowance is used up): the job waits in ``pending/`` until
    ``until`` (epoch seconds), and the attempt does not count against ``max_attempts``."""

    def __init__(self, until: float, reason: str) -> None:
        super().__init__(reason)
        self.until = until
        self.reason = reason
