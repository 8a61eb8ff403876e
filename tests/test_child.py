"""Work in a child process (`mnnbuild.base.child`): messages both ways, the result or the exception back, and no
child outliving its requester, however the requester ends."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mnnbuild.base.child import Channel, Child
from mnnbuild.base.fsutil import process_start
from tests.conftest import PROJECT_ROOT

SPAWN = multiprocessing.get_context("spawn")


def _echo(channel: Channel, first: int) -> int:
    channel.send(first)
    return int(channel.recv()) * 2


def _fail(channel: Channel) -> None:
    raise ValueError("bad input: field x")


def _gone(pid: int) -> bool:
    found = process_start(pid)
    return found is None or found[1] in ("Z", "X")


@pytest.mark.slow
def test_messages_both_ways_and_the_result() -> None:
    with Child(SPAWN, _echo, (3,), "echo") as child:
        assert child.recv() == 3
        child.send(5)
        assert child.result() == 10
    assert not child.process.is_alive()


@pytest.mark.slow
def test_the_childs_exception_is_raised_here() -> None:
    with Child(SPAWN, _fail, (), "failing") as child, pytest.raises(ValueError, match="bad input: field x"):
        child.result()


@pytest.mark.slow
def test_a_child_dies_with_its_requester(tmp_path: Path) -> None:
    """kill -9 the process that started a child (no handler of it runs): the child, busy sleeping, is gone within
    seconds (its watch thread sees the pipe close)."""
    script = tmp_path / "requester.py"
    script.write_text(
        textwrap.dedent(
            """
            import multiprocessing, time
            from mnnbuild.base.child import Child
            from tests.test_child import _sleep

            if __name__ == "__main__":
                child = Child(multiprocessing.get_context("spawn"), _sleep, (), "sleeper")
                print(child.recv(), flush=True)
                time.sleep(600)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        assert not _gone(pid), "the child runs"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid), "the child outlived its requester"
    finally:
        proc.kill()


def _sleep(channel: Channel) -> None:
    channel.send(os.getpid())
    time.sleep(600)


def test_an_interrupt_while_the_child_starts_is_held_until_it_can_be_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the child starts (its pid not known yet, so it could not be killed): held until the start
    returns, then raised here, the child killed first."""
    import signal

    started: list[multiprocessing.process.BaseProcess] = []
    real_start = SPAWN.Process.start

    def start(self: multiprocessing.process.BaseProcess) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # arrives mid-start
        real_start(self)
        started.append(self)

    monkeypatch.setattr(SPAWN.Process, "start", start)
    with pytest.raises(KeyboardInterrupt):
        Child(SPAWN, _sleep, (), "sleeper")
    (process,) = started
    assert process.pid is not None and not process.is_alive()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handler put back"


def test_a_start_that_fails_under_a_held_interrupt_raises_the_interrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C to the process group reaches the forkserver too, and the start then fails on its pipe (EOFError):
    what the user did was interrupt, so that is what is raised, not the pipe's traceback."""
    import signal

    def start(self: multiprocessing.process.BaseProcess) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # held: the handler only notes it
        raise EOFError("unexpected EOF")  # as forkserver.read_signed raises when the forkserver died

    monkeypatch.setattr(SPAWN.Process, "start", start)
    with pytest.raises(KeyboardInterrupt):
        Child(SPAWN, _sleep, (), "sleeper")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handler put back"
