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
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEPIPE_")}
    proc = subprocess.Popen([sys.executable, "-m", "voicepipe.cli", *extra_args, "serve", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        def failure() -> str | None:
            return f"server exited early:\n{proc.stdout.read()}" if proc.poll() is not None else None

        wait_until_ready(base, ready_timeout, failure)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)



def in_process_server(settings, ready_timeout: float = 180):
    """The real app under uvicorn in a background thread of this process, so tests can look inside it."""
    from voicepipe.server import serve_in_thread

    return serve_in_thread(settings, ready_timeout)
