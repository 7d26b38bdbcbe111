"""The CPU load of `--cpu-load N`: N processes that spin while the block runs and are gone after it, however it
ends, even when the process that started them is killed."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from voicepipe.cpu_load import cpu_load

DEADLINE_S = 30.0  # only a machine that never schedules the spinners waits this long


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {DEADLINE_S:g} s"
        time.sleep(0.05)


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def test_each_process_spins_on_a_core_while_the_block_runs_and_is_gone_after_it() -> None:
    with cpu_load(2) as pids:
        procs = [psutil.Process(pid) for pid in pids]
        assert len(procs) == 2
        for proc in procs:  # busy, never asleep: it gathers CPU time whenever the machine gives it a core
            wait_until(lambda proc=proc: cpu_s(proc) >= 0.3, "a spinner has not used 0.3 s of CPU")
            assert proc.status() == psutil.STATUS_RUNNING
    assert all(gone(proc) for proc in procs)
    with cpu_load(0) as none:
        assert none == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_error_or_ctrl_c_in_the_block_stops_the_processes(error: type[BaseException]) -> None:
    with pytest.raises(error), cpu_load(1) as pids:
        proc = psutil.Process(pids[0])
        raise error
    assert gone(proc)


def test_a_spinner_stops_by_itself_when_the_run_that_started_it_is_killed() -> None:
    run = subprocess.Popen([sys.executable, "-c", "import time\nfrom voicepipe.cpu_load import cpu_load\n"
                            "with cpu_load(1) as pids:\n    print(pids[0], flush=True)\n    time.sleep(60)"],
                           stdout=subprocess.PIPE, text=True)
    try:
        spinner = psutil.Process(int(run.stdout.readline()))
    finally:
        run.kill()  # SIGKILL: no `finally` runs in it
        run.wait()
    wait_until(lambda: gone(spinner), "the orphaned spinner did not stop")
