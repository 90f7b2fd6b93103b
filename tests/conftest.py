"""Shared fixtures: a real OpenAI-compatible test server on loopback (tests/fakeserver.py)."""

from __future__ import annotations

import os
from typing import Callable, Iterator

import pytest

from kvtest import FakeServer, start_fake


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Converted models go to a folder of this test session (shared by the servers it launches),
    not the user's ~/.cache; a cache folder set by the caller is kept."""
    if "KVQUAL_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["KVQUAL_CACHE_DIR"] = str(tmp_path_factory.mktemp("kvqual-cache"))
    yield
    del os.environ["KVQUAL_CACHE_DIR"]


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeServer]]:
    """Factory: `fake_server("--wrong-rate", "0.3")` starts one; all are stopped after the test."""
    started: list[FakeServer] = []

    def factory(*flags: str) -> FakeServer:
        server = start_fake(*flags)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


