"""Shared fixtures: a real OpenAI-compatible test server on loopback (tests/fakeserver.py)."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from kvtest import FakeServer, start_fake


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


