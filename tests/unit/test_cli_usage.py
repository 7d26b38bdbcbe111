"""A command line the user mistyped gets click's usage message and exit code 2, not a Python traceback."""

from __future__ import annotations

import pytest

from tests.cli_helpers import run_cli


@pytest.mark.parametrize(("args", "needle"), [
    (["replay", "run", "cases", "--json", "out.json"], "No such option: --json"),
    (["bench", "turns", "--cpu-load", "-1"], "Invalid value for '--cpu-load'"),
    (["no-such-command"], "No such command 'no-such-command'"),
])
def test_a_usage_error_prints_its_message_and_exits_2(args: list[str], needle: str) -> None:
    result = run_cli(*args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert "Usage: " in result.stderr and "--help" in result.stderr
    assert "Traceback" not in result.stderr
