"""Property-based fuzzing of every parser, a bounded number of examples per target (the long run is
`voicepipe bench fuzz`), and the runner that counts what the fuzzing finds."""

from __future__ import annotations

import json

import pytest
from hypothesis import strategies as st

from tests.cli_helpers import run_cli
from voicepipe.bench.fuzz import run_fuzz, run_target
from voicepipe.bench.fuzz_targets import Target, all_targets, memory_bound

EXAMPLES = 150  # per target: about 25 s for all of them on two cores
TARGETS = all_targets()


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_every_parser_holds_its_properties(target: Target) -> None:
    result = run_target(target, EXAMPLES, seed_value=0, stop_on_error=True)
    assert result["examples"] >= min(EXAMPLES, 20) and result["errors"] == 0


def test_the_targets_cover_every_parser() -> None:
    """Every parser of untrusted input has targets (the SIP parser's `sip` group joins once it lands)."""
    groups = {t.name.split(".")[0] for t in TARGETS}
    assert groups == {"twilio", "telnyx", "plivo", "vonage", "exotel", "native", "audiosocket", "sdp", "replay",
                      "settings", "sip"}
    assert {t.name for t in TARGETS} >= {f"{p}.{kind}" for p in ("twilio", "telnyx", "plivo", "vonage", "exotel",
                                                                 "native") for kind in ("decode", "roundtrip")}


def _odd_is_a_bug(n: int) -> None:
    if n % 2:
        raise KeyError(n)


def test_the_runner_counts_failing_examples_and_goes_on() -> None:
    target = Target("fake", st.integers(0, 10_000), _odd_is_a_bug, "odd numbers fail")
    result = run_target(target, 200, seed_value=1)
    assert result["examples"] == 200 and 0 < result["errors"] < 200
    [(where, sample)] = result["samples"].items()
    assert where.startswith("KeyError at test_fuzz.py:") and int(sample["example"]) % 2 == 1


def test_with_stop_on_error_the_failure_is_shrunk_and_raised() -> None:
    target = Target("fake", st.integers(0, 10_000), _odd_is_a_bug, "odd numbers fail")
    with pytest.raises(KeyError) as info:
        run_target(target, 200, seed_value=1, stop_on_error=True)
    assert info.value.args == (1,)  # hypothesis shrank it to the smallest odd number


def test_the_memory_bound_catches_a_parser_that_allocates_too_much() -> None:
    with pytest.raises(AssertionError, match="allocated"), memory_bound(10):
        blob = bytearray(2 * 1024 * 1024)
    del blob
    with memory_bound(10):
        small = bytearray(1000)
    del small


def test_the_report_is_flat_and_counts_every_target() -> None:
    lines: list[str] = []
    report = run_fuzz(5, only=["sdp", "settings.load"], seed_value=3, progress=lines.append)
    assert report["targets"] == 4 and len(lines) == 4 and lines[0].startswith("[1/4] sdp.offer: ")
    assert all(not isinstance(v, dict | list) for v in report.values())
    names = ("sdp.offer", "sdp.oversize", "sdp.roundtrip", "settings.load")
    assert report["examples_total"] == sum(report[f"{n}.examples"] for n in names) > 0
    assert report["errors_total"] == 0
    with pytest.raises(ValueError, match="no fuzz target matches"):
        run_fuzz(5, only=["nothing"])


def test_bench_fuzz_writes_its_json_and_exits_0_with_no_errors(tmp_path) -> None:
    out = tmp_path / "fuzz.json"
    result = run_cli("bench", "fuzz", "--examples", "10", "--target", "native", "--seed", "2", "--json", str(out),
                     timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["native.decode.examples"] > 0 and report["native.roundtrip.errors"] == 0
    assert "[2/2] native.roundtrip" in result.stderr and "0 errors" in result.stdout
