"""The provider contract (tests/provider_contract.py) run over every built-in provider
kind, each against tools/provsim.py, a real HTTP server on 127.0.0.1 that misbehaves on
command (``#fault=`` in a prompt). A plug-in kind runs the same class against its own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from provider_contract import ProviderContract
from provsim import ProviderSim

from spool.kinds.generate import providers
from spool.kinds.generate.providers import Provider, open_provider, parse_provider

TOKEN = "r8_ContractTokenValue_0123456789abcdef"


@pytest.fixture(scope="module")
def sim() -> Iterator[ProviderSim]:
    with ProviderSim(token=TOKEN, work=0.2) as s:
        yield s


class SimulatedKind(ProviderContract):
    kind = ""
    token = TOKEN

    @pytest.fixture(autouse=True)
    def _server(self, sim: ProviderSim) -> None:
        self.url = sim.url

    def open(self, token: str | None = None) -> Provider:
        table = {
            "kind": self.kind,
            "base_url": self.url,
            "token_env": "CONTRACT_TOKEN",
            "request_timeout": 2.0,
        }
        return open_provider(
            parse_provider(f"sim-{self.kind}", table), env={"CONTRACT_TOKEN": token or TOKEN}
        )

    def fault(self, prompt: str, fault: str) -> str:
        return f"{prompt} #fault={ {'lose': 'lose:1'}.get(fault, fault) }"


class TestReplicate(SimulatedKind):
    kind = "replicate"
    model = "acme/video-1"

    def input(self, prompt: str) -> dict[str, Any]:
        return {"prompt": prompt}


class TestRunway(SimulatedKind):
    kind = "runway"
    model = "gen4_turbo"
    finds_lost_creates = False  # Runway's API has no listing of tasks

    def input(self, prompt: str) -> dict[str, Any]:
        return {"promptText": prompt, "ratio": "1280:720"}


def test_every_built_in_kind_runs_the_contract() -> None:
    assert {cls.kind for cls in SimulatedKind.__subclasses__()} == set(providers.BUILTIN)
