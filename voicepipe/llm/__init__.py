"""llm room (see DESIGN.md)."""
