"""The ops' event loop: an interrupt reaches the process's own handler, after the work unwinds."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from agentenv_dagster.runtime.loop import new_event_loop, run


class Interrupted(BaseException):
    """What Dagster's step-process handler raises (DagsterExecutionInterruptedError is a BaseException)."""


def raise_interrupted(signum, frame):
    raise Interrupted()


async def sleep_until_interrupted(unwound: list[str]) -> None:
    """Sleep until a SIGINT from another thread (as Dagster's terminate arrives) wakes the loop.
    The timer starts once the loop runs, so the signal always finds ``run``'s handler in place."""
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        await asyncio.sleep(30)
    finally:
        unwound.append("finally ran")
        timer.join()


@pytest.mark.parametrize("handler", [raise_interrupted, signal.default_int_handler])
def test_sigint_unwinds_the_coroutine_then_raises_what_the_process_handler_raises(handler):
    expected = Interrupted if handler is raise_interrupted else KeyboardInterrupt
    previous = signal.signal(signal.SIGINT, handler)
    unwound: list[str] = []
    try:
        with pytest.raises(expected):
            run(sleep_until_interrupted(unwound))
        assert unwound == ["finally ran"]
        assert signal.getsignal(signal.SIGINT) is handler  # restored once the loop is done
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_handler_that_defers_interrupts_leaves_the_cancellation():
    noted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        with pytest.raises(asyncio.CancelledError):
            run(sleep_until_interrupted([]))
        assert noted == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_results_and_errors_come_back_unchanged():
    async def answer():
        return 42

    async def fail():
        raise ValueError("no")

    assert run(answer()) == 42
    with pytest.raises(ValueError, match="no"):
        run(fail())


def test_loops_in_several_threads_start_processes_without_racing():
    """uvloop refuses a process start while another thread's loop is starting one ("Racing
    with another loop to spawn a process"); the ops of a run each run such a loop in a thread
    of their own, so the loops made here take turns to start their processes."""
    failures: list[BaseException] = []
    started = threading.Barrier(8)

    def start_processes() -> None:
        async def go() -> None:
            started.wait()  # every thread's loop at once
            for _ in range(15):
                process = await asyncio.create_subprocess_exec("true")
                assert await process.wait() == 0

        loop = new_event_loop()
        try:
            loop.run_until_complete(go())
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            failures.append(exc)
        finally:
            loop.close()

    threads = [threading.Thread(target=start_processes) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
