"""What a submitter writes: the shape of a submission, checked field by field at
decoding (documented in docs/jobs.md). Acceptance (:mod:`spool.queue.accept`) turns one
into a frozen job with the help of its kind; the kinds and the dependency resolver
read it too, which is why it is a module of its own.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, cast

import msgspec

from spool.core.model import Expect
from spool.core.sourceref import SourceRef

Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9._-]{0,95}$")]
Revision = Annotated[int, msgspec.Meta(ge=1, le=999_999_999)]
TagKey = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]
TagValue = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
FileName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
User = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._@+-]{1,64}$")]
PathText = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
#: A source's role in a job (``main``, ``logo``): the key of ``sources``.
Role = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]{0,31}$")]


class OutputRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    file: FileName | None = None
    expect: Expect = msgspec.field(default_factory=Expect)


class Submission(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What a submitter writes (documented in docs/jobs.md): the fields every submission
    has. Each kind adds its own one (:func:`for_kind`: a render's ``recipe``, a
    generation's ``generate``), so a kind owns its schema and acceptance knows none."""

    name: Name
    revision: Revision = 1
    supersedes: str | None = None
    #: The job's kind (:data:`spool.kinds.KINDS`): ``render`` unless said otherwise.
    operation: str = "render"
    #: A path inside the asset roots, or another job's output (spool.queue.depends: ``{"job": ...}``
    #: or ``{"asset": ...}``).
    sources: Annotated[dict[Role, PathText | SourceRef], msgspec.Meta(max_length=32)] = {}
    output: OutputRequest = msgspec.field(default_factory=OutputRequest)
    tags: dict[TagKey, TagValue] = {}
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    submitted_by: User | None = None

    #: The field of a kind's submission type that holds the kind's own part.
    spec_field: ClassVar[str | None] = None

    @property
    def spec(self) -> Any:
        """The kind's own part, as its kind's ``spec_type`` decoded it (``None``: absent, or a
        kind without one)."""
        return getattr(self, self.spec_field) if self.spec_field else None


_TYPES: dict[str, type[Submission]] = {}


def for_kind(kind: str, spec_field: str | None, spec_type: Any) -> type[Submission]:
    """The submission type of one kind: every submission's fields and the kind's own field
    (optional), decoded as ``spec_type``; any other field is refused naming the allowed ones."""
    if spec_field is None:
        return Submission
    known = _TYPES.get(kind)
    if known is not None:
        return known
    made = msgspec.defstruct(
        f"{kind.title()}Submission",
        [(spec_field, spec_type | None, None)],
        bases=(Submission,),
        kw_only=True,
        forbid_unknown_fields=True,
        namespace={"spec_field": spec_field},
    )
    _TYPES[kind] = cast(type[Submission], made)
    return _TYPES[kind]
