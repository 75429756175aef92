"""The event loop every op and embedded server runs on: uvloop where it is installed, else the standard loop.

uvloop refuses to start a process while a loop in another thread is starting one (MagicStack/uvloop#508),
and a run's ops each run a loop in a thread, so the loops made here start processes one at a time.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from functools import partial
from types import FrameType
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

T = TypeVar("T")

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency wherever it builds
    uvloop = None

SPAWNING = threading.Lock()  # held by the loop (of any thread) that is starting a process


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the fastest kind available."""
    return _Loop() if uvloop else asyncio.new_event_loop()


async def _spawning_alone(start: Callable[[], Awaitable[T]]) -> T:
    """``start()`` while no other loop starts a process (the lock is polled: a task of the same loop may hold it)."""
    while not SPAWNING.acquire(blocking=False):
        await asyncio.sleep(0.002)
    try:
        return await start()
    finally:
        SPAWNING.release()


if uvloop is not None:
    class _Loop(uvloop.Loop):
        """uvloop's loop, starting its processes one loop at a time (:data:`SPAWNING`)."""

        async def subprocess_exec(self, *args: Any, **kwargs: Any) -> Any:
            return await _spawning_alone(partial(super().subprocess_exec, *args, **kwargs))

        async def subprocess_shell(self, *args: Any, **kwargs: Any) -> Any:
            return await _spawning_alone(partial(super().subprocess_shell, *args, **kwargs))


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the fastest loop, interruptible: uvloop runs a SIGINT handler (Dagster's raises) in a loop
    callback and only logs what it raises, so SIGINT cancels the coroutine and the handler then runs outside."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        handler = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread() or not callable(handler):
            return runner.run(coroutine)
        main = runner.get_loop().create_task(coroutine)
        interrupted: list[FrameType | None] = []

        def cancel_main(signum: int, frame: FrameType | None) -> None:
            interrupted.append(frame)
            main.cancel()

        signal.signal(signal.SIGINT, cancel_main)
        try:
            return runner.run(asyncio.wait_for(main, None))  # a coroutine awaiting the task
        except asyncio.CancelledError:
            if interrupted:
                handler(signal.SIGINT, interrupted[0])  # raises, unless the process defers interrupts
            raise
        finally:
            signal.signal(signal.SIGINT, handler)
