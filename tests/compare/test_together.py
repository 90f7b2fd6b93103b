"""A round's parts run together; when one fails, the others stop before the command does."""

from __future__ import annotations

import asyncio

import pytest

from kvqual.compare.flow import together
from kvqual.errors import InfrastructureError


def test_a_failing_part_stops_its_sibling_before_the_failure_propagates() -> None:
    closed: list[str] = []

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise InfrastructureError("base: 16 requests in a row failed")

    async def long_part() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # an aclose() of its connections
            closed.append("replicate")

    async def main() -> None:
        with pytest.raises(InfrastructureError, match="in a row failed"):  # the first failure, as it is
            await together(fails(), long_part())
        assert closed == ["replicate"]  # closed before the failure reached the caller

    asyncio.run(main())


def test_parts_that_succeed_give_their_results_in_order() -> None:
    async def value(x: int) -> int:
        await asyncio.sleep(0.01 * (3 - x))
        return x

    assert asyncio.run(together(value(1), value(2))) == [1, 2]
