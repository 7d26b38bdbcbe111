"""Benchmarks that span several rooms (the speech benchmark; the LLM engine's lives in voicepipe/llm)."""
