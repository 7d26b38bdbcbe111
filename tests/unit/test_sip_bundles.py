"""The two checked-in SIP client bundles are the ones scripts/build-sip-bundles.sh makes from the pinned npm
packages: each names its package and version in its banner, ships its licence, and matches the checksum its
README records (a bundle edited or rebuilt by hand without the script fails here)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PINS = json.loads((ROOT / "scripts" / "sip-bundles" / "package.json").read_text())["dependencies"]
BUNDLES = [("jssip", ROOT / "voicepipe" / "web" / "sipphone" / "vendor" / "jssip.min.js"),
           ("sip.js", ROOT / "tests" / "browser" / "sipjs" / "sip.min.js")]


@pytest.mark.parametrize(("package", "bundle"), BUNDLES, ids=[p for p, _ in BUNDLES])
def test_a_bundle_is_its_pinned_package_with_licence_and_checksum(package: str, bundle: Path) -> None:
    banner = bundle.read_text().split("\n", 1)[0]
    assert banner.startswith(f"/*! {package} {PINS[package]} (MIT licence"), banner
    licence = bundle.parent / f"LICENSE.{package}.md"
    assert "MIT License" in licence.read_text()
    readme = (bundle.parent / "README.md").read_text()
    recorded = re.search(r"sha256: `([0-9a-f]{64})`", readme)[1]
    assert hashlib.sha256(bundle.read_bytes()).hexdigest() == recorded
    assert f"`{package}` {PINS[package]}" in readme
