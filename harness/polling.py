"""The one way tests wait for something: poll a condition until it holds or a deadline passes."""
from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Awaitable, Callable


async def until(condition: Callable[[], Any], what: str = "the condition", *, timeout: float = 60.0,
                interval: float = 0.2, pause: Callable[[float], Awaitable[Any]] | None = None) -> Any:
    """Return `condition()`'s first truthy value (it may be async); fail naming `what` after `timeout`.

    `pause`: how to wait between polls (`pilot.pause` in app tests, so the app keeps running)."""
    pause = pause or asyncio.sleep
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await pause(interval)
