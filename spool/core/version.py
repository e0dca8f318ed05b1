"""Which spool this is: the installed package's version, written into worker records and
the self-check's memo (so an upgrade is noticed)."""

from __future__ import annotations


def installed() -> str:
    """The installed ``spool`` distribution's version, or ``"unknown"`` (a source tree)."""
    try:
        from importlib.metadata import version  # here: only a daemon's start needs it

        return version("spool")
    except Exception:
        return "unknown"
