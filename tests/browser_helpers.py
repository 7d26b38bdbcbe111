"""Headless Debian Chromium (/usr/bin/chromium) driven by Playwright, for the browser tests.

Playwright never downloads a browser here; the flags keep Chromium off the network it cannot reach.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]


@contextmanager
def chromium(*extra_args: str) -> Iterator[object]:
    """A Playwright `Browser` on Debian's Chromium with a fresh profile; closed on exit."""
    from playwright.sync_api import sync_playwright

    if shutil.which(CHROMIUM) is None:
        raise RuntimeError(f"{CHROMIUM} is missing: run scripts/install-system-deps.sh")
    profile = tempfile.mkdtemp(prefix="voicepipe-chromium-")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=[*CHROMIUM_ARGS, *extra_args])
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)
