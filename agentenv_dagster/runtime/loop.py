"""The event loop every op and every embedded server runs on: uvloop where it is installed.

A dataset op drives thousands of HTTP round trips on one loop, and an agent host answers
them on another; uvloop's loop spends less CPU on each (figures: docs/performance.md).
Without uvloop (Windows) the standard loop does the same.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from types import FrameType
from typing import Any, Coroutine, TypeVar


T = TypeVar("T")

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency wherever it builds
    uvloop = None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the fastest kind available."""
    return uvloop.new_event_loop() if uvloop else asyncio.new_event_loop()


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the fastest loop available, interruptible as the process expects.

    A process's own SIGINT handler (Dagster's, in a step process, raises
    ``DagsterExecutionInterruptedError``) must not run inside the loop: uvloop runs Python
    signal handlers in a loop callback and only logs what they raise, so a cancelled run's
    step would sleep on. Instead SIGINT cancels the coroutine, which unwinds (its ``finally``
    blocks run), and then the process's handler runs outside the loop and raises as it means to.
    """
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
            return runner.run(_result_of(main))
        except asyncio.CancelledError:
            if interrupted:
                handler(signal.SIGINT, interrupted[0])  # raises, unless the process defers interrupts
            raise
        finally:
            signal.signal(signal.SIGINT, handler)


async def _result_of(task: asyncio.Task[T]) -> T:
    return await task
