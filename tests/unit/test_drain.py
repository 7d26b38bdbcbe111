"""SIGTERM on `voicepipe serve`'s server (voicepipe/drain.py), in a subprocess without models: a call in progress
(a held admission place) keeps the process draining, /ready says so, and a second SIGTERM stops it at once; with
no call in progress the first SIGTERM exits 0. The end-to-end drain with a real call is in
tests/e2e/test_call_scale.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx

from tests.net_helpers import free_port

SERVER = """
import sys
from voicepipe.config import load_settings
from voicepipe.server import create_app, run_server

settings = load_settings(overrides={"server": {"port": int(sys.argv[1]), "drain_timeout_s": 60}})
app = create_app(settings, load_models=False)
if sys.argv[2] == "call":
    app.state.admission.admit("native")  # a call in progress that does not end by itself
run_server(app, settings)
"""


def start(call: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), "call" if call else "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{base}/health", timeout=1)
            return proc, base
        except httpx.TransportError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)


def test_a_drain_waits_for_the_call_and_a_second_sigterm_stops_at_once() -> None:
    proc, base = start(call=True)
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None, "the process stopped with a call in progress"
        ready = httpx.get(f"{base}/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["draining"] and ready.json()["active_calls"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) != 0  # cut short: not a clean exit
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopping now: 1 call(s) still in progress are cut" in proc.stdout.read()


def test_with_no_call_in_progress_sigterm_exits_0() -> None:
    proc, _ = start(call=False)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0, proc.stdout.read()
