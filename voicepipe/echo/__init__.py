"""Echo: what the agent played, where its echo sits in the caller's audio, and the canceller that removes it.

Imports `audio/` and `errors.py` only; knows no call and no transport (docs/echo.md).
"""
