"""`voicepipe bench fuzz`: every fuzz target of `fuzz_targets.py` for a number of examples, counting the examples
tried and the errors found (an error is an example whose property failed: a parser raised something other than its
typed error, a round trip came back different, or a parser went over its memory bound). The target is 0 errors.

The unit tests run the same targets (`run_target(..., stop_on_error=True)`), so that hypothesis shrinks a failure
to its smallest example and the test shows it.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from voicepipe.bench.fuzz_targets import Target, all_targets

ERROR_SAMPLES = 3  # distinct errors kept per target, with a failing example each


@contextmanager
def quiet_parsers():
    """The parsers log every bad frame; a fuzz run sends thousands, so those lines are silenced meanwhile."""
    logger = logging.getLogger("voicepipe")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def run_target(target: Target, examples: int, *, seed_value: int | None = None, stop_on_error: bool = False,
               ) -> dict[str, Any]:
    """Run `target` for `examples` examples; returns the examples tried, the errors and a sample of them.

    With `stop_on_error` the first failure propagates, shrunk by hypothesis (for tests); otherwise every failing
    example is counted and the run goes on. `seed_value` makes the run reproducible (the tests pass one)."""
    counts = {"examples": 0, "errors": 0}
    samples: dict[str, dict[str, Any]] = {}

    def prop(example: Any) -> None:
        counts["examples"] += 1
        if stop_on_error:
            target.check(example)
            return
        try:
            target.check(example)
        except Exception as exc:  # the point of fuzzing: whatever escapes is a finding, not a crash of the run
            counts["errors"] += 1
            where = traceback.extract_tb(exc.__traceback__)[-1]
            key = f"{type(exc).__name__} at {where.filename.rsplit('/', 1)[-1]}:{where.lineno}"
            if key not in samples and len(samples) < ERROR_SAMPLES:
                samples[key] = {"error": f"{type(exc).__name__}: {exc}"[:300], "example": repr(example)[:300]}

    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if stop_on_error else [])
    test = settings(max_examples=examples, deadline=None, database=None, phases=phases, derandomize=False,
                    suppress_health_check=list(HealthCheck))(given(target.strategy)(prop))
    if seed_value is not None:
        test = seed(seed_value)(test)
    with quiet_parsers():
        test()
    return {**counts, "samples": samples}


def run_fuzz(examples: int, only: list[str] | None = None, seed_value: int | None = None,
             progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every target (or those named in `only`, by name or prefix) for `examples` examples each. The report is
    flat: `<target>.examples`, `<target>.errors`, `<target>.seconds`, and the totals."""
    targets = [t for t in all_targets() if not only or any(t.name == o or t.name.startswith(f"{o}.") for o in only)]
    if not targets:
        raise ValueError(f"no fuzz target matches {only}; targets: {', '.join(t.name for t in all_targets())}")
    report: dict[str, Any] = {"examples_per_target": examples, "seed": seed_value, "targets": len(targets)}
    findings: dict[str, Any] = {}
    started = time.perf_counter()
    for i, target in enumerate(targets, 1):
        t0 = time.perf_counter()
        result = run_target(target, examples, seed_value=seed_value)
        seconds = time.perf_counter() - t0
        report.update({f"{target.name}.examples": result["examples"], f"{target.name}.errors": result["errors"],
                       f"{target.name}.seconds": round(seconds, 2)})
        for key, sample in result["samples"].items():
            findings[f"{target.name}: {key}"] = sample
        progress(f"[{i}/{len(targets)}] {target.name}: {result['examples']} examples, {result['errors']} errors "
                 f"({seconds:.1f} s)")
    report["examples_total"] = sum(report[f"{t.name}.examples"] for t in targets)
    report["errors_total"] = sum(report[f"{t.name}.errors"] for t in targets)
    report["seconds_total"] = round(time.perf_counter() - started, 2)
    for n, (name, sample) in enumerate(findings.items()):
        report[f"finding.{n}.where"] = name
        report[f"finding.{n}.error"] = sample["error"]
        report[f"finding.{n}.example"] = sample["example"]
    return report
