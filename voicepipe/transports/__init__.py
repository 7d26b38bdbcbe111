"""transports room (see DESIGN.md)."""
