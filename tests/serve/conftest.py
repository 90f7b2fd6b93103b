"""One in-process server per KV dtype for the whole session (the weights load once)."""

import pytest


@pytest.fixture(scope="session")
def bf16_url():
    from kvqual.serve import running_server

    with running_server(kv_cache_dtype="bf16", port=0, max_batch=8) as url:
        yield url


@pytest.fixture(scope="session")
def fp8_url():
    from kvqual.serve import running_server

    with running_server(kv_cache_dtype="fp8_e4m3", port=0, max_batch=8) as url:
        yield url
