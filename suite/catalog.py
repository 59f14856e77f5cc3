"""Every registered provider. Importing this module imports ``suite.providers``, whose modules
register themselves with ``suite.registry``; the registry itself imports no provider, so the
two never import each other."""
from __future__ import annotations

import suite.providers  # noqa: F401  (importing registers every provider)
from suite.registry import PROVIDERS, Provider


def get(name: str) -> Provider:
    try:
        return PROVIDERS[name]
    except KeyError:
        known = ", ".join(sorted(PROVIDERS))
        raise ValueError(f"unknown provider {name!r}; known providers: {known}") from None


def names() -> list[str]:
    return list(PROVIDERS)


def in_figure_order() -> list[Provider]:
    """Registered providers by their ``order`` (then registration order)."""
    return sorted(PROVIDERS.values(), key=lambda p: p.order)


def peer_origins() -> dict[str, dict]:
    """{provider: its installed peer's version/commit/source} for every installed peer (what
    env.json records, so a result names the peer versions it measured)."""
    return {p.name: info for p in PROVIDERS.values() if (info := p.installed())}
