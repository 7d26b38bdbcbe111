"""vad room (see DESIGN.md)."""
