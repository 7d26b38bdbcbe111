"""llm room (see docs/architecture.md)."""
