"""``[providers.<name>]`` of ``spool.toml`` -> a typed :class:`ProviderConfig`.

The generate kind's settings schema. A provider table names the *environment
variable* that holds the token (``token_env``), never the token: the token
lives only in the daemon's environment and in the ``Authorization`` header of
requests to ``base_url``. :func:`secret_names` lists those variable names so
the caller can hand them to :func:`spool.core.secrets.install_from`, which masks
their values in every log, event, failure record and error message.

Example::

    [providers.replicate]
    kind = "replicate"
    base_url = "https://api.replicate.com"
    token_env = "REPLICATE_API_TOKEN"
    in_flight = 50                 # generations waiting at the provider at once
    deadline = "1h"                # an attempt that has not produced a file by then is cancelled
    retention = "1h"               # the provider forgets inputs and outputs after this
    output_key = "video"           # a model whose output is an object: the key holding the video

    [providers.replicate.polling]
    first = 5.0                    # seconds after create before the first poll
    base = 2.0                     # backoff: min(ceiling, base * factor**polls), full jitter
    factor = 2.0
    ceiling = 60.0
    retry_after_max = 600.0        # a provider's Retry-After is honoured up to this

    [providers.replicate.download]
    max_bytes = "2GiB"
    timeout = 600.0                # seconds for one whole download
    min_rate = "16KiB"             # bytes/s over `stall` seconds; slower is a stalled download
    stall = 30.0

    [providers.replicate.spending]
    per_hour = 60                  # create requests; 0 = none allowed
    per_day = 500

    [providers.replicate.retries.create]   # the retry table's entries can be overridden
    attempts = 5

Nothing here imports the kind's machinery (HTTP clients): every command reads
``spool.toml``, and most never call a provider.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec

from spool.core.decoding import convert
from spool.core.errors import ConfigError, InvalidInput
from spool.core.units import Seconds, parse_size

#: A provider's name: the key of ``[providers.<name>]`` and a folder name under ``providers/``.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
#: ``token_env`` is an environment variable's name, not a value.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: What real tokens start with (Replicate ``r8_``, Runway ``key_``, OpenAI-style ``sk-``),
#: case and all: an environment variable named ``KEY_FILE`` is a name.
TOKEN_PREFIXES = ("r8_", "key_", "sk-", "sk_", "ghp_")

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


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
    #: Seconds for one whole download, from the request to the last byte.
    timeout: Seconds = 600.0
    #: The slowest a download may be (bytes a second, ``"16KiB"``), averaged over
    #: ``stall`` seconds; a slower one is stalled and is cut off.
    min_rate: int | str = "16KiB"
    stall: Seconds = 30.0
    #: Seconds past the attempt's deadline a retrieval that began before it may take.
    grace: Seconds = 600.0

    @property
    def max_bytes_int(self) -> int:
        return parse_size(self.max_bytes)

    @property
    def min_rate_int(self) -> int:
        return parse_size(self.min_rate)


class Spending(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Most create requests per rolling hour and day, across every process and host."""

    per_hour: NonNegativeInt = 60
    per_day: NonNegativeInt = 500


class RetryOverride(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One entry of the retry table (:mod:`spool.kinds.generate.retries`), overridden."""

    initial: Seconds | None = None
    factor: Annotated[float, msgspec.Meta(ge=1.0, le=10.0)] | None = None
    ceiling: Seconds | None = None
    attempts: PositiveInt | None = None


class Retries(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Overrides of the retry table, per remote operation."""

    create: RetryOverride = msgspec.field(default_factory=RetryOverride)
    find: RetryOverride = msgspec.field(default_factory=RetryOverride)
    download: RetryOverride = msgspec.field(default_factory=RetryOverride)
    cancel: RetryOverride = msgspec.field(default_factory=RetryOverride)


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
    #: Time the provider keeps a job queued (Runway ``THROTTLED``) does not count against
    #: ``deadline``, up to this much.
    queue_deadline: float | str = "6h"
    #: Seconds for one API request (create, get, cancel, list).
    request_timeout: Seconds = 30.0
    #: Runway's ``X-Runway-Version`` (an API version date); ignored by other kinds.
    api_version: str = "2024-11-06"
    #: How long the provider keeps a job's input and output ("1h" for Replicate's API
    #: predictions; empty: the kind's default). A create whose fate is unknown and older
    #: than this can never be proven unmade.
    retention: float | str | None = None
    #: Seconds the provider's listing may lag behind a create: "not listed" sooner is no evidence.
    listing_settle: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    #: A model whose output is a JSON object: the key that holds the video's URL.
    output_key: str | None = None
    #: After an ambiguous create that cannot be proven unmade, let the next attempt create
    #: again by itself (it may pay twice). Off: the job fails and waits for an operator.
    auto_retry_ambiguous: bool = False
    #: A create the provider refused for its quota (Runway's 429 on create is the daily
    #: quota): seconds before one create is tried again, when the reply says nothing.
    quota_wait: float | str = "1h"
    polling: Polling = msgspec.field(default_factory=Polling)
    download: Download = msgspec.field(default_factory=Download)
    spending: Spending = msgspec.field(default_factory=Spending)
    retries: Retries = msgspec.field(default_factory=Retries)

    @property
    def deadline_seconds(self) -> float:
        return parse_duration(self.deadline)

    @property
    def queue_deadline_seconds(self) -> float:
        return parse_duration(self.queue_deadline)

    @property
    def quota_wait_seconds(self) -> float:
        return parse_duration(self.quota_wait)

    @property
    def retention_seconds(self) -> float | None:
        """Seconds the provider keeps inputs (``None``: forever, as far as spool knows)."""
        if self.retention is None or self.retention == "":
            return RETENTION.get(self.kind)
        return parse_duration(self.retention)

    def token(self, env: Mapping[str, str] | None = None) -> str:
        """The API token from the environment; a missing one names the variable, never a value."""
        value = (os.environ if env is None else env).get(self.token_env, "")
        if not value:
            raise ConfigError(
                f"[providers.{self.name}] token_env",
                f"the environment variable {self.token_env} is not set in the daemon's environment",
            )
        return value


#: Each built-in kind's retention when the table says none (Replicate deletes an API
#: prediction's input and output an hour after it is made).
RETENTION: dict[str, float | None] = {"replicate": 3600.0, "runway": None}

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


def looks_like_token(value: str) -> bool:
    """Whether a ``token_env`` value is a pasted token rather than a variable's name.

    Environment variables are named in upper case by convention (POSIX); a value with
    a token's prefix, or 20 or more characters of a token's alphabet in mixed case
    or with a ``-``, is a token."""
    if value.startswith(TOKEN_PREFIXES):
        return True
    if len(value) < 20 or not re.fullmatch(r"[A-Za-z0-9_\-.]+", value):
        return False
    return not re.fullmatch(r"[A-Z0-9_]+", value)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_provider(name: str, table: Any) -> ProviderConfig:
    """One ``[providers.<name>]`` table, checked; errors name ``[providers.<name>] <field>``."""
    where = f"[providers.{name}]"
    if not NAME_RE.match(name):
        raise ConfigError(where, "a provider name is lower-case letters, digits, '-' and '_'")
    if not isinstance(table, dict):
        raise ConfigError(where, "must be a table")
    raw_env = table.get("token_env")
    if isinstance(raw_env, str) and looks_like_token(raw_env):
        # Checked before anything else can quote the value back; never echo it.
        raise ConfigError(
            f"{where} token_env",
            "holds what looks like a token itself; put the token in an environment variable and "
            "name that variable here (like REPLICATE_API_TOKEN)",
        )
    try:
        cfg = convert(table, ProviderConfig)
    except InvalidInput as exc:
        raise ConfigError(f"{where} {exc.field}", exc.problem) from None
    if cfg.name and cfg.name != name:
        raise ConfigError(f"{where} name", "must be left out: the table's key names the provider")
    cfg = msgspec.structs.replace(cfg, name=name, base_url=cfg.base_url.rstrip("/"))
    if not re.match(r"^https?://[^/\s]+", cfg.base_url):
        raise ConfigError(f"{where} base_url", f"{cfg.base_url!r} is not an http(s) URL")
    parts = urlsplit(cfg.base_url)
    if parts.scheme == "http" and not _loopback(parts.hostname or ""):
        raise ConfigError(
            f"{where} base_url",
            "must be https:// (over http:// the token would travel in clear); "
            "http:// is accepted only for a loopback address",
        )
    if not ENV_NAME_RE.match(cfg.token_env):
        raise ConfigError(
            f"{where} token_env",
            "must be the NAME of an environment variable (like REPLICATE_API_TOKEN), not the token",
        )
    for field, check in (
        ("deadline", lambda: cfg.deadline_seconds),
        ("queue_deadline", lambda: cfg.queue_deadline_seconds),
        ("quota_wait", lambda: cfg.quota_wait_seconds),
        ("retention", lambda: cfg.retention_seconds),
        ("download.max_bytes", lambda: cfg.download.max_bytes_int),
        ("download.min_rate", lambda: cfg.download.min_rate_int),
    ):
        try:
            check()
        except ValueError as exc:
            raise ConfigError(f"{where} {field}", str(exc)) from None
    if cfg.polling.ceiling < cfg.polling.floor:
        raise ConfigError(f"{where} polling.ceiling", "must not be below polling.floor")
    if cfg.output_key is not None and not cfg.output_key.strip():
        raise ConfigError(f"{where} output_key", "must name a key of the model's output object")
    return cfg


def parse_providers(tables: Any) -> dict[str, ProviderConfig]:
    """The whole ``[providers]`` table: ``{name: ProviderConfig}``."""
    if tables is None:
        return {}
    if not isinstance(tables, dict):
        raise ConfigError("[providers]", "must be a table of [providers.<name>] tables")
    return {name: parse_provider(name, table) for name, table in tables.items()}


def pool_name(provider: str) -> str:
    """The resource pool a provider's generations draw from (see :mod:`spool.kinds.pools`)."""
    return f"provider:{provider}"


def pool_capacities(configs: Iterable[ProviderConfig]) -> dict[str, int]:
    """``{pool: in_flight}`` for :func:`spool.kinds.registry.capacities` to merge with the render pool."""
    return {pool_name(c.name): c.in_flight for c in configs}


def secret_names(configs: Iterable[ProviderConfig]) -> list[str]:
    """The environment variables whose values :mod:`spool.core.secrets` must mask."""
    return sorted({c.token_env for c in configs})
