"""Hosted video model providers for the generate kind (SPEC section 8).

:func:`open_provider` turns a ``[providers.<name>]`` table into a live
:class:`~spool.kinds.generate.providers.base.Provider`. The built-in kinds are ``replicate``
and ``runway``; another kind plugs in as an entry point of the
``spool.providers`` group whose object is a :class:`Provider` subclass (or a
factory) called as ``factory(config, token)``::

    [project.entry-points."spool.providers"]
    acme = "acme_spool:AcmeProvider"

A plug-in may not shadow a built-in kind.

The HTTP side (:mod:`.base` on httpx, whose import brings click and rich, and
the built-in clients) loads on first use: every command reads ``spool.toml``,
whose ``[providers]`` tables :mod:`.config` parses, and most never call a provider.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from spool.core.errors import ConfigError
from spool.kinds.generate.providers.config import (
    ProviderConfig,
    parse_provider,
    parse_providers,
    secret_names,
)

if TYPE_CHECKING:
    from spool.kinds.generate.providers.base import (
        FINAL,
        Downloaded,
        HttpProvider,
        Lookup,
        Provider,
        ProviderError,
        RemoteJob,
        Status,
    )

#: The entry-point group other provider kinds register in.
GROUP = "spool.providers"

Factory = Callable[..., "Provider"]

#: What :mod:`.base` defines and this package re-exports (loaded on first use).
_FROM_BASE = frozenset(
    {"FINAL", "Downloaded", "HttpProvider", "Lookup", "Provider"} | {"ProviderError", "RemoteJob", "Status"}
)


def _builtin() -> dict[str, Factory]:
    """The built-in kinds (their clients import httpx)."""
    # here: httpx (which brings click and rich) loads on first use (+~165 ms)
    from spool.kinds.generate.providers.replicate import Replicate

    # here: httpx (which brings click and rich) loads on first use (+~165 ms)
    from spool.kinds.generate.providers.runway import Runway

    return {"replicate": Replicate, "runway": Runway}


def __getattr__(name: str) -> Any:
    if name in _FROM_BASE:
        # here: httpx (which brings click and rich) loads on first use (+~165 ms)
        from spool.kinds.generate.providers import base

        return getattr(base, name)
    if name == "BUILTIN":
        return _builtin()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BUILTIN",
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
    from importlib.metadata import entry_points

    builtin = _builtin()
    found: dict[str, Factory] = dict(builtin)
    for ep in entry_points(group=GROUP):
        if ep.name in builtin:
            continue  # a plug-in never replaces a built-in kind
        found.setdefault(ep.name, _lazy(ep))
    return found


def _lazy(ep: Any) -> Factory:
    def make(config: ProviderConfig, token: str, **kw: Any) -> Provider:
        # here: httpx (which brings click and rich) loads on first use (+~165 ms)
        from spool.kinds.generate.providers.base import Provider

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
                f"the plug-in {ep.value!r} did not make a spool.kinds.generate.providers.Provider",
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
