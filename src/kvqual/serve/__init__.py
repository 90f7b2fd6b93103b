"""kvqual's embedded reference server: a real model behind an OpenAI-compatible API,
with a bf16 or fp8 (e4m3 / e5m2) KV cache. Stands alone: imports nothing else of kvqual.

Heavy imports (torch, transformers) happen only when a server is built.
"""

from __future__ import annotations

from typing import Any

__all__ = ["running_server", "build_state"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kvqual.serve import server

        return getattr(server, name)
    raise AttributeError(name)
