"""Start real servers on loopback for tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from voicepipe.server import wait_until_ready


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(*extra_args: str, ready_timeout: float = 180) -> Iterator[str]:
    """`voicepipe serve` in a subprocess on a free port; yields its base URL once /ready is true."""
    with server_process(*extra_args, ready_timeout=ready_timeout) as (base, _proc):
        yield base


@contextmanager
def server_process(*extra_args: str, ready_timeout: float = 180,
                   wait: bool = True) -> Iterator[tuple[str, subprocess.Popen]]:
    """`voicepipe serve` in a subprocess on a free port; yields ``(base URL, process)`` once /ready is true (at once
    without ``wait``: then call `wait_for_process`). The test may signal or kill the process; whatever is left is
    terminated after."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEPIPE_")}
    proc = subprocess.Popen([sys.executable, "-m", "voicepipe.cli", *extra_args, "serve", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        if wait:
            wait_for_process(base, proc, ready_timeout)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)


def wait_for_process(base: str, proc: subprocess.Popen, ready_timeout: float = 180) -> None:
    """Wait until the server process at ``base`` is ready; its output in the error if it exits first."""
    def failure() -> str | None:
        return f"server exited early:\n{proc.stdout.read()}" if proc.poll() is not None else None

    wait_until_ready(base, ready_timeout, failure)


def in_process_server(settings, ready_timeout: float = 180):
    """The real app under uvicorn in a background thread of this process, so tests can look inside it."""
    from voicepipe.server import serve_in_thread

    return serve_in_thread(settings, ready_timeout)
