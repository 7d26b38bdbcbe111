"""Run the real `voicepipe` command line in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEPIPE_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "voicepipe.cli", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)
