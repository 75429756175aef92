"""The queue an agent's process gives a2a-sdk before Python 3.13 behaves as the one a2a-sdk
would use otherwise (culsans' asyncio side), scenario for scenario."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from agentenv_dagster.builtin.agents.queues import QueueShutDown, ShutdownQueue

pytestmark = pytest.mark.anyio

QUEUES = {"ours": (lambda maxsize=0: ShutdownQueue(maxsize=maxsize), QueueShutDown)}
if importlib.util.find_spec("culsans"):  # a2a-sdk's dependency before Python 3.13
    import culsans

    QUEUES["culsans"] = (lambda maxsize=0: culsans.Queue(maxsize=maxsize).async_q, culsans.AsyncQueueShutDown)


@pytest.fixture(params=sorted(QUEUES))
def kind(request):
    return QUEUES[request.param]


async def test_a_shut_down_queue_refuses_puts_and_hands_out_what_it_holds(kind):
    make, shut_down = kind
    queue = make()
    await queue.put(1)
    queue.put_nowait(2)
    queue.shutdown()
    with pytest.raises(shut_down):
        await queue.put(3)
    with pytest.raises(shut_down):
        queue.put_nowait(3)
    assert [await queue.get(), queue.get_nowait()] == [1, 2]
    with pytest.raises(shut_down):
        await queue.get()
    with pytest.raises(shut_down):
        queue.get_nowait()


async def test_shutting_down_wakes_a_waiting_getter_and_putter(kind):
    make, shut_down = kind
    empty, full = make(), make(maxsize=1)
    full.put_nowait("x")
    getter, putter = asyncio.create_task(empty.get()), asyncio.create_task(full.put("y"))
    await asyncio.sleep(0.01)
    assert not getter.done() and not putter.done()
    empty.shutdown()
    full.shutdown()
    for waiting in (getter, putter):
        with pytest.raises(shut_down):
            await asyncio.wait_for(waiting, 1)
    assert full.get_nowait() == "x"


async def test_an_immediate_shutdown_drops_the_items_and_releases_join(kind):
    make, shut_down = kind
    queue = make()
    for item in range(3):
        queue.put_nowait(item)
    queue.get_nowait()
    queue.task_done()
    joining = asyncio.create_task(queue.join())
    await asyncio.sleep(0.01)
    assert not joining.done()
    queue.shutdown(immediate=True)
    await asyncio.wait_for(joining, 1)
    assert queue.empty()
    with pytest.raises(shut_down):
        queue.get_nowait()


async def test_a_queue_that_stays_open_is_an_asyncio_queue(kind):
    make, _ = kind
    queue = make(maxsize=2)
    consumer = asyncio.create_task(queue.get())
    await queue.put("a")
    assert await asyncio.wait_for(consumer, 1) == "a"
    queue.task_done()
    await asyncio.wait_for(queue.join(), 1)
    with pytest.raises(asyncio.QueueEmpty):
        queue.get_nowait()
