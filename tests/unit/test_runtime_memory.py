"""The process-wide memory setting the runtime applies before loading the models (``server.malloc_arenas``)."""

from __future__ import annotations

import platform

from voicepipe.config import Settings
from voicepipe.runtime import limit_malloc_arenas


def test_the_default_caps_glibcs_malloc_arenas() -> None:
    assert Settings().server.malloc_arenas == 2
    assert limit_malloc_arenas(2) == (platform.libc_ver()[0] == "glibc")


def test_zero_leaves_mallocs_default_alone() -> None:
    assert limit_malloc_arenas(0) is False
