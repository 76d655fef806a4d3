"""The background process: lower priority, and a call always answered, child or no child."""

from __future__ import annotations

import os

import pytest

from extproc.background import Background


def niceness() -> int:
    return os.nice(0)


def pid_or_die(parent: int) -> int:
    """In a child: die as a crashed child would. In the parent's thread: say who ran it."""
    if os.getpid() != parent:
        os._exit(3)
    return os.getpid()


def fails() -> None:
    raise ValueError("from the work itself")


async def test_the_child_runs_at_a_lower_priority_than_the_gate() -> None:
    background = Background()
    try:
        child = await background.run(niceness)
        assert await background.run(os.getpid) != os.getpid()
    finally:
        background.close()
    assert child == min(19, niceness() + background.nice)


async def test_a_crashed_child_costs_one_call_in_a_thread_and_is_replaced() -> None:
    background = Background()
    try:
        first = await background.run(os.getpid)
        assert await background.run(pid_or_die, os.getpid()) == os.getpid()  # answered here
        second = await background.run(os.getpid)
    finally:
        background.close()
    assert os.getpid() not in (first, second) and first != second


async def test_where_no_child_can_start_every_call_runs_in_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    background = Background()

    def refused() -> None:
        raise RuntimeError("no spawn here")

    monkeypatch.setattr(background, "_executor", refused)
    assert await background.run(os.getpid) == os.getpid()
    assert await background.run(os.getpid) == os.getpid()


async def test_what_the_work_raises_is_raised_to_the_caller() -> None:
    background = Background()
    try:
        with pytest.raises(ValueError, match="from the work itself"):
            await background.run(fails)
        assert await background.run(os.getpid) != os.getpid()  # the child is still there
    finally:
        background.close()


def policy() -> int:
    return os.sched_getscheduler(0)


async def test_the_child_is_scheduled_only_when_a_core_is_idle_where_linux_allows() -> None:
    background = Background()
    try:
        assert await background.run(policy) == os.SCHED_IDLE
    finally:
        background.close()
