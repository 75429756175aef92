"""An asyncio queue that can be shut down, as Python 3.13's, for a2a-sdk on 3.11 and 3.12.

a2a-sdk moves every event of a task through queues that must be shut down. On 3.13 it uses
``asyncio.Queue``; before 3.13, which has no ``shutdown``, it uses culsans, a queue safe
across threads as well, built on aiologic's locks, whose cost shows in every message,
though the agent's queues are only ever used from its event loop. ``install()`` (called in
an agent's own process, before a2a's modules that bind the queue are imported) gives a2a
this queue in its place: ``asyncio.Queue`` with 3.13's ``shutdown`` semantics.
"""

from __future__ import annotations

import asyncio
import sys
import types
from typing import Any

COMPAT_MODULE = "a2a.utils._async_queue_compat"  # what a2a-sdk imports its queue from


class QueueShutDown(Exception):
    """Raised by ``put`` on a shut-down queue, and by ``get`` once it is also empty."""


class ShutdownQueue(asyncio.Queue):
    """``asyncio.Queue`` plus 3.13's ``shutdown(immediate=False)``. Waiting getters and
    putters are woken with ``QueueShutDown``, so asyncio's own waiting loops end."""

    _is_shutdown = False

    async def put(self, item: Any) -> None:
        if self._is_shutdown:
            raise QueueShutDown
        await super().put(item)

    def put_nowait(self, item: Any) -> None:
        if self._is_shutdown:
            raise QueueShutDown
        super().put_nowait(item)

    async def get(self) -> Any:
        if self._is_shutdown and self.empty():
            raise QueueShutDown
        return await super().get()

    def get_nowait(self) -> Any:
        if self._is_shutdown and self.empty():
            raise QueueShutDown
        return super().get_nowait()

    def shutdown(self, immediate: bool = False) -> None:
        """No more puts; with ``immediate`` the items left are dropped (and count as done,
        so ``join`` returns), else getters take them before they see ``QueueShutDown``."""
        self._is_shutdown = True
        if immediate:
            while not self.empty():
                self._get()
                if self._unfinished_tasks > 0:
                    self._unfinished_tasks -= 1
            if self._unfinished_tasks == 0:
                self._finished.set()
        for waiters in (self._getters, self._putters):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(QueueShutDown())


def install() -> None:
    """Before 3.13, a2a-sdk's queues are these; a no-op once a2a's own module is imported
    (its classes already bound) or on 3.13, where a2a uses ``asyncio.Queue`` itself."""
    if sys.version_info >= (3, 13) or COMPAT_MODULE in sys.modules:
        return
    module = types.ModuleType(COMPAT_MODULE, __doc__)
    module.AsyncQueue = ShutdownQueue
    module.QueueShutDown = QueueShutDown
    module.create_async_queue = ShutdownQueue  # called as create_async_queue(maxsize=...)
    module.__all__ = ["AsyncQueue", "QueueShutDown", "create_async_queue"]
    sys.modules[COMPAT_MODULE] = module
