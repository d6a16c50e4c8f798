"""Bounded polling for tests: wait for a state change, fail with a message when it never comes.

A `while True` poll turns a broken feature into a hung CI job; these helpers turn
it into a failure that says what was awaited and what was last seen. The bound is
a deadline for something that should happen, not a timing assertion.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

Check = Callable[[], Any | Awaitable[Any]]


async def eventually(check: Check, *, timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    """Call `check` (sync or async) until it returns something truthy, and return that.

    Fails the test naming `what` and the last value seen once `timeout_s` has passed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s (last seen: {value!r})")
        await asyncio.sleep(every_s)


def eventually_sync(check: Callable[[], Any], *, timeout_s: float, what: str,
                    every_s: float = 0.05) -> Any:
    """`eventually` for synchronous tests."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s (last seen: {value!r})")
        time.sleep(every_s)
