"""Work the stand-in's event loop awaits, run on a daemon thread: vLLM ends at SIGTERM whatever is in
flight, and the default executor's threads are joined at exit (a first build, a slow import or a long
answer would hold the process past its stop)."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def in_daemon_thread(fn: Callable[[], T], name: str) -> "asyncio.Future[T]":
    """`fn()` on a daemon thread, as a future of the running loop (not `asyncio.to_thread`)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def work() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, None, exc)
            return
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=work, name=name, daemon=True).start()
    return fut
