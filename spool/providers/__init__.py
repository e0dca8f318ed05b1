"""Hosted video model providers for generation jobs (SPEC section 8).

:func:`open_provider` turns a ``[providers.<name>]`` table into a live
:class:`~spool.providers.base.Provider`. The built-in kinds are ``replicate``
and ``runway``; another kind plugs in as an entry point of the
``spool.providers`` group whose object is a :class:`Provider` subclass (or a
factory) called as ``factory(config, token)``::

    [project.entry-points."spool.providers"]
    acme = "acme_spool:AcmeProvider"

A plug-in may not shadow a built-in kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from ..errors import ConfigError
from .base import (
    CHECK_PROVIDER,
    FINAL,
    Downloaded,
    HttpProvider,
    Lookup,
    Provider,
    ProviderError,
    RemoteJob,
    Status,
)
from .config import ProviderConfig, parse_provider, parse_providers, secret_names
from .replicate import Replicate
from .runway import Runway

#: The entry-point group other provider kinds register in.
GROUP = "spool.providers"

Factory = Callable[..., Provider]

BUILTIN: dict[str, Factory] = {"replicate": Replicate, "runway": Runway}

__all__ = [
    "BUILTIN",
    "CHECK_PROVIDER",
    "FINAL",
    "GROUP",
    "Downloaded",
    "HttpProvider",
    "Lookup",
    "Provider",
    "ProviderConfig",
    "ProviderError",
    "RemoteJob",
    "Status",
    "kinds",
    "open_provider",
    "parse_provider",
    "parse_providers",
    "secret_names",
]


def kinds() -> dict[str, Factory]:
    """Every provider kind: the built-ins, then the plug-ins of :data:`GROUP`."""
    found: dict[str, Factory] = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        if ep.name in BUILTIN:
            continue  # a plug-in never replaces a built-in kind
        found.setdefault(ep.name, _lazy(ep))
    return found


def _lazy(ep: Any) -> Factory:
    def make(config: ProviderConfig, token: str, **kw: Any) -> Provider:
        try:
            factory = ep.load()
        except Exception as exc:
            raise ConfigError(
                f"[providers.{config.name}] kind",
                f"the plug-in {ep.value!r} for kind {ep.name!r} could not be loaded ({type(exc).__name__})",
            ) from None
        provider = factory(config, token, **kw)
        if not isinstance(provider, Provider):
            raise ConfigError(
                f"[providers.{config.name}] kind",
                f"the plug-in {ep.value!r} did not make a spool.providers.Provider",
            )
        return provider

    return make


def open_provider(config: ProviderConfig, env: Mapping[str, str] | None = None, **kw: Any) -> Provider:
    """A live provider for ``config``; the token is read from ``config.token_env`` now."""
    available = kinds()
    factory = available.get(config.kind)
    if factory is None:
        raise ConfigError(
            f"[providers.{config.name}] kind",
            f"{config.kind!r} is not a provider kind (known: {', '.join(sorted(available))})",
        )
    return factory(config, config.token(env), **kw)
