"""``[providers.<name>]`` of ``spool.toml`` -> a typed :class:`ProviderConfig`.

A provider table names the *environment variable* that holds the token
(``token_env``), never the token: the token lives only in the daemon's
environment and in the ``Authorization`` header of requests to ``base_url``.
:func:`secret_names` lists those variable names so the caller can hand them to
:func:`spool.secrets.install_from`, which masks their values in every log,
event, failure record and error message.

Example::

    [providers.replicate]
    kind = "replicate"
    base_url = "https://api.replicate.com"
    token_env = "REPLICATE_API_TOKEN"
    in_flight = 50                 # generations waiting at the provider at once
    deadline = "1h"                # an attempt that has not produced a file by then is cancelled

    [providers.replicate.polling]
    first = 5.0                    # seconds after create before the first poll
    base = 2.0                     # backoff: min(ceiling, base * factor**polls), full jitter
    factor = 2.0
    ceiling = 60.0
    retry_after_max = 600.0        # a provider's Retry-After is honoured up to this

    [providers.replicate.download]
    max_bytes = "2GiB"
    timeout = 600.0                # seconds for one whole download

    [providers.replicate.spending]
    per_hour = 60                  # create requests; 0 = none allowed
    per_day = 500
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import msgspec

from ..config import Seconds, parse_size
from ..decoding import convert
from ..errors import ConfigError, InvalidInput

#: A provider's name: the key of ``[providers.<name>]`` and a folder name under ``providers/``.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
#: ``token_env`` is an environment variable's name, not a value.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class Polling(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """When to ask a provider again: bounded exponential backoff with full jitter."""

    #: Seconds from the create to the first poll (video models take a while).
    first: Seconds = 5.0
    #: The backoff's base and growth: the n-th poll waits up to ``base * factor**n``.
    base: Seconds = 2.0
    factor: Annotated[float, msgspec.Meta(ge=1.0, le=10.0)] = 2.0
    #: No interval between two polls of one generation is longer than this.
    ceiling: Seconds = 60.0
    #: Full jitter never waits less than this (a zero wait would hammer the provider).
    floor: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    #: A provider's ``Retry-After`` is honoured up to this many seconds.
    retry_after_max: Seconds = 600.0


class Download(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Limits for fetching a finished generation's file."""

    #: Largest file accepted; a longer body is cut off and fails (``"2GiB"`` or bytes).
    max_bytes: int | str = "2GiB"
    #: Seconds for one whole download (connect + every read).
    timeout: Seconds = 600.0

    @property
    def max_bytes_int(self) -> int:
        return parse_size(self.max_bytes)


class Spending(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Most create requests per rolling hour and day, across every process and host."""

    per_hour: NonNegativeInt = 60
    per_day: NonNegativeInt = 500


class ProviderConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One ``[providers.<name>]`` table (``name`` is filled in from the table's key)."""

    name: str = ""
    #: ``replicate``, ``runway``, or a kind registered in the ``spool.providers`` entry-point group.
    kind: str
    #: The API's root, e.g. ``https://api.replicate.com`` (no trailing ``/v1``).
    base_url: str
    #: The NAME of the environment variable holding the API token.
    token_env: str
    #: Generations of this provider in flight (submitted, not yet downloaded) at once.
    in_flight: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 50
    #: Seconds an attempt may take from create to a downloaded file (or "1h", "30m").
    deadline: float | str = 3600.0
    #: Seconds for one API request (create, get, cancel, list).
    request_timeout: Seconds = 30.0
    #: Runway's ``X-Runway-Version`` (an API version date); ignored by other kinds.
    api_version: str = "2024-11-06"
    polling: Polling = msgspec.field(default_factory=Polling)
    download: Download = msgspec.field(default_factory=Download)
    spending: Spending = msgspec.field(default_factory=Spending)

    @property
    def deadline_seconds(self) -> float:
        return parse_duration(self.deadline)

    def token(self, env: Mapping[str, str] | None = None) -> str:
        """The API token from the environment; a missing one names the variable, never a value."""
        value = (os.environ if env is None else env).get(self.token_env, "")
        if not value:
            raise ConfigError(
                f"[providers.{self.name}] token_env",
                f"the environment variable {self.token_env} is not set in the daemon's environment",
            )
        return value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_DURATION_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: float | int | str) -> float:
    """Seconds from ``3600``, ``"90s"``, ``"30m"``, ``"1h"`` or ``"2d"``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError("must be greater than 0")
        return float(value)
    m = _DURATION.match(str(value))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{value!r} is not a duration like 3600, '90s', '30m' or '1h'")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def parse_provider(name: str, table: Any) -> ProviderConfig:
    """One ``[providers.<name>]`` table, checked; errors name ``[providers.<name>] <field>``."""
    where = f"[providers.{name}]"
    if not NAME_RE.match(name):
        raise ConfigError(where, "a provider name is lower-case letters, digits, '-' and '_'")
    if not isinstance(table, dict):
        raise ConfigError(where, "must be a table")
    try:
        cfg = convert(table, ProviderConfig)
    except InvalidInput as exc:
        raise ConfigError(f"{where} {exc.field}", exc.problem) from None
    if cfg.name and cfg.name != name:
        raise ConfigError(f"{where} name", "must be left out: the table's key names the provider")
    cfg = msgspec.structs.replace(cfg, name=name, base_url=cfg.base_url.rstrip("/"))
    if not re.match(r"^https?://[^/\s]+", cfg.base_url):
        raise ConfigError(f"{where} base_url", f"{cfg.base_url!r} is not an http(s) URL")
    if not ENV_NAME_RE.match(cfg.token_env):
        # Catch the classic mistake of pasting the token itself; never echo it back.
        raise ConfigError(
            f"{where} token_env",
            "must be the NAME of an environment variable (like REPLICATE_API_TOKEN), not the token",
        )
    for field, check in (
        ("deadline", lambda: cfg.deadline_seconds),
        ("download.max_bytes", lambda: cfg.download.max_bytes_int),
    ):
        try:
            check()
        except ValueError as exc:
            raise ConfigError(f"{where} {field}", str(exc)) from None
    if cfg.polling.ceiling < cfg.polling.floor:
        raise ConfigError(f"{where} polling.ceiling", "must not be below polling.floor")
    return cfg


def parse_providers(tables: Any) -> dict[str, ProviderConfig]:
    """The whole ``[providers]`` table: ``{name: ProviderConfig}``."""
    if tables is None:
        return {}
    if not isinstance(tables, dict):
        raise ConfigError("[providers]", "must be a table of [providers.<name>] tables")
    return {name: parse_provider(name, table) for name, table in tables.items()}


def pool_name(provider: str) -> str:
    """The resource pool a provider's generations draw from (see :mod:`spool.pools`)."""
    return f"provider:{provider}"


def pool_capacities(configs: Iterable[ProviderConfig]) -> dict[str, int]:
    """``{pool: in_flight}`` for :func:`spool.pools.capacities` to merge with the render pool."""
    return {pool_name(c.name): c.in_flight for c in configs}


def secret_names(configs: Iterable[ProviderConfig]) -> list[str]:
    """The environment variables whose values :mod:`spool.secrets` must mask."""
    return sorted({c.token_env for c in configs})
