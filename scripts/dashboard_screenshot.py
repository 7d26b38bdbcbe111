#!/usr/bin/env python3
"""Screenshot a call's dashboard page (the per-turn waterfall) from a call store, in headless Chromium.

    .venv/bin/python scripts/dashboard_screenshot.py [--data-dir data] [--call ID] [--out reports/waterfall.png]

Serves the dashboard from the store alone (no models are loaded) on a free loopback port, opens
/dashboard/calls/<id> (the latest call by default) and writes a full-page PNG. Prints the call id, its turn
count and the number of bar groups the page drew.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.browser_helpers import chromium  # noqa: E402
from voicepipe.config import load_settings  # noqa: E402
from voicepipe.server import create_app  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="paths.data_dir of the store")
    parser.add_argument("--call", help="call id (default: the latest call)")
    parser.add_argument("--out", type=Path, default=Path("reports/waterfall.png"))
    args = parser.parse_args()

    settings = load_settings(overrides={"paths": {"data_dir": str(args.data_dir)}, "observability": {"metrics": False}})
    app = create_app(settings, load_models=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                calls = httpx.get(f"{base}/api/calls", params={"since": 0}, timeout=5).json()["calls"]
                break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            print("error: the dashboard server did not start", file=sys.stderr)
            return 1
        call_id = args.call or (calls[0]["id"] if calls else None)
        if call_id is None:
            print(f"error: no calls in {args.data_dir / 'calls.sqlite3'}", file=sys.stderr)
            return 1
        turns = len(httpx.get(f"{base}/api/calls/{call_id}", timeout=5).json()["turns"])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with chromium() as browser:
            page = browser.new_page()
            page.set_viewport_size({"width": 1400, "height": 900})
            page.goto(f"{base}/dashboard/calls/{call_id}")
            groups = page.locator("svg.waterfall g.turn").count()
            page.screenshot(path=str(args.out), full_page=True)
        print(f"call {call_id}: {turns} turns, {groups} bar groups drawn -> {args.out}")
        return 0
    finally:
        server.should_exit = True


if __name__ == "__main__":
    sys.exit(main())
