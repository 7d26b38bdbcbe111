"""A throwaway PostgreSQL server for the shared call store's tests: Debian's `postgresql` package (installed by
scripts/install-system-deps.sh), a fresh cluster in a temporary folder, on a free loopback port.

PostgreSQL refuses to run as root; as root (CI) the server runs as the package's `postgres` user."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.net_helpers import free_port

USER = "voicepipe"


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    path = found[-1] if found else shutil.which(name)
    if path is None:
        raise RuntimeError(f"PostgreSQL's {name} is missing: run scripts/install-system-deps.sh "
                           "(apt-get install postgresql)")
    return path


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yields the URL of an empty database ``calls`` on a new server; stops it and deletes its files after."""
    import psycopg

    root = Path(tempfile.mkdtemp(prefix="voicepipe-pg-"))
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()
    subprocess.run([*as_user, _bin("initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8",
                    "--no-sync"], check=True, capture_output=True)
    server = subprocess.Popen([*as_user, _bin("postgres"), "-D", str(data), "-p", str(port), "-k", str(root),
                               "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"postgresql://{USER}@127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(f"{base}/postgres", autocommit=True, connect_timeout=2) as conn:
                    conn.execute("CREATE DATABASE calls")
                break
            except psycopg.OperationalError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start:\n{server.stdout.read()}") from None
                time.sleep(0.2)
        yield f"{base}/calls"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(root, ignore_errors=True)
