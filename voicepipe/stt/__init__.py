"""stt room (see DESIGN.md)."""
