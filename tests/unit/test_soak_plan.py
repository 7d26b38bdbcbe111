"""The soak's plan and bounds (the calls themselves run in tests/e2e/test_hardening.py)."""

from __future__ import annotations

from voicepipe.bench import soak
from voicepipe.bench.soak import (
    EXACT,
    EXECUTOR_THREADS_MAX,
    KINDS,
    RSS_GROWTH_MB,
    TRANSPORTS,
    bound_problems,
    plan_calls,
)


def test_the_warm_up_reaches_every_transport_and_the_run_every_transport_and_kind() -> None:
    plans = plan_calls(50)
    assert {p.transport for p in plans[:len(TRANSPORTS)]} == set(TRANSPORTS)
    pairs = {(p.transport, p.kind) for p in plans}
    assert pairs == {(t, k) for t in TRANSPORTS for k in KINDS} - {("webrtc", "bad_frames")}
    assert sum(p.record for p in plans) == 17 and [p.healthy for p in plans] == [p.kind != "abrupt" for p in plans]


def snapshot(**changes: float) -> dict[str, float]:
    base = {key: 0.0 for key in EXACT} | {"rss_mb": 1000.0, "threads": 30, "executor_threads": 2, "fds": 27,
                                           "tasks": 3}
    return base | changes


def test_bounds_hold_counts_exactly_threads_at_most_and_rss_within_its_growth(monkeypatch) -> None:
    monkeypatch.setattr(soak, "threads_per_pool_thread", lambda: 2)  # a pool thread and its OpenMP team of 1
    warm = snapshot()
    assert bound_problems(snapshot(rss_mb=1000 + RSS_GROWTH_MB, threads=29), warm) == []
    assert bound_problems(snapshot(threads=34, executor_threads=4), warm) == []  # two pool threads, and their teams
    assert bound_problems(snapshot(fds=28), warm) == ["fds: 28 after, 27 warm"]
    assert bound_problems(snapshot(llm_sessions=1, tts_streams=1), warm) == [
        "llm_sessions: 1 after, 0 warm", "tts_streams: 1 after, 0 warm"]
    assert bound_problems(snapshot(threads=31), warm) == [
        "threads: 31 after, more than 30 (30 warm, 0 more executor threads)"]
    assert bound_problems(snapshot(threads=35, executor_threads=4), warm)[0].startswith("threads: 35 after")
    assert bound_problems(snapshot(executor_threads=EXECUTOR_THREADS_MAX + 1, threads=99), warm)[-1].startswith(
        "executor_threads")
    assert bound_problems(snapshot(rss_mb=1000 + RSS_GROWTH_MB + 1), warm)[0].startswith("rss_mb grew 51.0 MB")
