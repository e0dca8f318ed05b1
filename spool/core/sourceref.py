"""A source that is not a file: the output of another job (``{"job": "mug-gen"}``,
``{"job": "mug-gen@2"}``) or the one asset a library query finds (``{"asset": "..."}``).

Its own module because acceptance, the kinds and the edit-file reader all need to
recognise one, while resolving it (waiting, freezing, holding) is :mod:`spool.queue.depends`.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec


class SourceRef(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A submission's source that names a job (``job``) or a library query (``asset``)."""

    job: str | None = None
    asset: str | None = None


def refs(sources: Mapping[str, object]) -> dict[str, SourceRef]:
    """The sources of a submission that name other jobs, by role."""
    return {role: v for role, v in sources.items() if isinstance(v, SourceRef)}
