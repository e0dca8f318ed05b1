"""The generate kind's job record: a provider, a model and the input passed to it verbatim."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from spool.core.model import JobBase, Record

ProviderName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class GenerateSpec(Record, forbid_unknown_fields=True, kw_only=True):
    """What to ask which provider for; frozen with the job and hashed as ``recipe_hash``."""

    #: A ``[providers.<name>]`` table of ``spool.toml`` (a job never carries a URL or a token).
    provider: ProviderName
    #: The provider's model: ``owner/name``, ``owner/name:<version>`` or
    #: ``deployment:owner/name`` (replicate), ``gen4_turbo`` or ``<endpoint>:<model>`` (runway).
    model: ModelName
    #: Passed to the provider verbatim (prompt, duration, ratio, ...).
    input: dict[str, Any]


class GenerateJob(JobBase, tag="generate"):
    """A generation job file: the frozen provider request."""

    generate: GenerateSpec
