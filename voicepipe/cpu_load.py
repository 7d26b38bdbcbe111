"""CPU load beside a run: `cpu_load(n)` keeps n processes spinning on the cores until its block ends.

`voicepipe replay --cpu-load N` and `voicepipe bench turns --cpu-load N` use it to show what a busy machine does
to the calls. Each spinner is a plain Python process in a session of its own, so a Ctrl-C in the terminal reaches
the run, whose `finally` stops them, and not the spinners. A spinner also stops by itself once its parent is gone
(the run killed with SIGKILL), so no run leaves one behind.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

# Busy work in slices of a few ms, checking between them that the process that started it (its pid is the argument:
# one read at start-up could already see the parent's death) is still its parent.
SPIN = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(200_000):
        pass
"""

STOP_TIMEOUT_S = 5.0


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[list[int]]:
    """`processes` spinning processes for the block (none for 0); yields their pids; stopped and reaped at its end,
    however it ends."""
    spinners: list[subprocess.Popen] = []
    try:
        for _ in range(processes):
            spinners.append(subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())], stdin=subprocess.DEVNULL,
                                             start_new_session=True))
        yield [p.pid for p in spinners]
    finally:
        for p in spinners:
            p.terminate()
        for p in spinners:
            try:
                p.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
