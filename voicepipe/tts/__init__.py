"""tts room (see DESIGN.md)."""
