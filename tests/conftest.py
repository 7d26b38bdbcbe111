"""Shared fixtures. End-to-end tests (marker `e2e`) use the real default models under models/."""

from __future__ import annotations

import pytest

from voicepipe.config import Settings, load_settings


@pytest.fixture(scope="session")
def settings() -> Settings:
    """The effective default settings, with the real models directory."""
    return load_settings()
