"""Errors that carry a user-facing message and the fix, printed as one line by the CLI."""


class VoicepipeError(Exception):
    """An error the user can act on. `str()` gives one line: what went wrong, then the fix."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message} Fix: {fix}" if fix else message)


class SettingsError(VoicepipeError):
    """A setting is unknown or has a bad value."""


class ModelError(VoicepipeError):
    """A model is missing, corrupt, or cannot be fetched."""
