"""Settings for test servers of real calls, and a check that several call tests share."""

from __future__ import annotations

from pathlib import Path

from voicepipe.config import Settings, load_settings

GREETING = "Hi, how can I help?"


def call_settings(tmp: Path, **sections: dict) -> Settings:
    """A real-call test server's settings: short greedy replies after a greeting, a small KV pool, and the call
    store and recordings under `tmp`. Each keyword is a settings section merged over these."""
    tree: dict[str, dict] = {
        "calls": {"max_reply_tokens": 16, "greeting": GREETING, "temperature": 0.0},
        "llm": {"kv_cache_mib": 64},
        "paths": {"data_dir": str(tmp / "data"), "recordings_dir": str(tmp / "recordings")},
    }
    for section, values in sections.items():
        tree[section] = {**tree.get(section, {}), **values}
    return load_settings(overrides=tree)


def assert_history_keeps_what_was_heard(record: dict) -> None:
    """Turn 1's reply was interrupted and turn 2's was not: the LLM history keeps only the heard part of reply 1."""
    t1, t2 = record["turns"]
    assert t1["interrupted"] and not t2["interrupted"]
    replies = [m["content"] for m in record["history"] if m["role"] == "assistant"]
    kept, full = replies[1].strip(), t1["agent_text"].strip()  # [greeting, interrupted reply, answer to turn 2]
    assert len(kept) < len(full) and full.startswith(kept), (kept, full)
    assert t1["heard_text"] is not None and len(t1["heard_text"]) <= len(full)
