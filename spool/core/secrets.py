"""Secrets never reach logs, events, failure records or ``spool show``.

What counts as a secret: the values of environment variables whose names say
so (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*API_KEY*``, ``*CREDENTIAL*``),
the variables ``[secrets] env`` names, and the contents of the files
``[secrets] files`` lists (a provider token kept outside the spool). Values
shorter than :data:`MIN_LENGTH` are ignored: redacting "1" everywhere would
destroy logs and protect nothing.

Every text spool writes from an outside source (FFmpeg's stderr, a probe
error, an exception message, a provider's reply) passes :func:`redact`
before it reaches a file: the render log, failure records, the journal,
rejection reasons and the daemon's own log.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: Environment variable names that hold secrets.
SECRET_NAMES = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL|PRIVATE_KEY", re.I)
#: Shorter values are not treated as secrets.
MIN_LENGTH = 6
#: What a secret is replaced with.
MASK = "[redacted]"

_pattern: re.Pattern[str] | None = None


def collect(env: Mapping[str, str], names: Iterable[str] = (), files: Iterable[str] = ()) -> list[str]:
    """The secret values known from the environment and token files."""
    wanted = set(names)
    values = [v for k, v in env.items() if (SECRET_NAMES.search(k) or k in wanted)]
    for f in files:
        try:
            values.append(Path(f).read_text().strip())
        except OSError:
            continue
    return sorted({v for v in values if len(v) >= MIN_LENGTH}, key=len, reverse=True)


def install(values: Iterable[str]) -> None:
    """Make :func:`redact` mask these values (longest first), process-wide."""
    global _pattern
    vals = [v for v in values if v]
    _pattern = re.compile("|".join(re.escape(v) for v in vals)) if vals else None


def install_from(cfg_names: Iterable[str], cfg_files: Iterable[str]) -> None:
    install(collect(os.environ, cfg_names, cfg_files))


def child_env() -> dict[str, str]:
    """This process's environment minus anything secret: FFmpeg needs no tokens."""
    return {k: v for k, v in os.environ.items() if not SECRET_NAMES.search(k)}


def known() -> bool:
    """Whether any secret is known (else :func:`redact` changes nothing)."""
    return _pattern is not None


def redact(text: str) -> str:
    """``text`` with every known secret masked."""
    if _pattern is None or not text:
        return text
    return _pattern.sub(MASK, text)


def redact_bytes(data: bytes) -> bytes:
    if _pattern is None or not data:
        return data
    return redact(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def _redacting_filter() -> type:
    import logging  # here: the CLI never logs; only the daemon installs the filter (+~5 ms)

    class RedactingFilter(logging.Filter):
        """A logging filter that masks secrets in every record's final message."""

        def filter(self, record: logging.LogRecord) -> bool:
            if _pattern is not None:
                record.msg = redact(record.getMessage())
                record.args = None
                if record.exc_info and record.exc_info[1] is not None:
                    record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
                    record.exc_info = None
            return True

    return RedactingFilter


def __getattr__(name: str) -> Any:
    """``RedactingFilter`` (a ``logging.Filter``) is made on first use: the CLI's
    reading commands log nothing, and importing logging would cost them a
    tenth of their start-up."""
    if name == "RedactingFilter":
        cls = globals()["RedactingFilter"] = _redacting_filter()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
