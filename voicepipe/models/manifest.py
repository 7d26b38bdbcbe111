"""The manifest of default models (``models/manifest.json``) and checksum verification."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voicepipe.config import REPO_ROOT
from voicepipe.errors import ModelError

MANIFEST_PATH = REPO_ROOT / "models" / "manifest.json"
# Written by a conversion step: checksums of the files it produced, verified like the manifest's.
CONVERTED_MANIFEST = "converted.json"


@dataclass(frozen=True)
class ModelEntry:
    name: str
    kind: str
    description: str
    source: dict[str, Any]
    files: dict[str, str]
    convert: str | None = None


def load_manifest(path: Path = MANIFEST_PATH) -> dict[str, ModelEntry]:
    raw = json.loads(path.read_text())
    return {
        name: ModelEntry(
            name=name,
            kind=spec["kind"],
            description=spec.get("description", ""),
            source=spec["source"],
            files=spec["files"],
            convert=spec.get("convert"),
        )
        for name, spec in raw.items()
    }


def sha256_file(path: Path, on_bytes: Any = None, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
            if on_bytes is not None:
                on_bytes(len(block))
    return digest.hexdigest()


def expected_files(entry: ModelEntry, model_dir: Path) -> dict[str, str]:
    """All files a complete model directory must hold, with their sha256."""
    files = dict(entry.files)
    converted = model_dir / CONVERTED_MANIFEST
    if entry.convert:
        if not converted.is_file():
            raise ModelError(
                f"model {entry.name!r} in {model_dir} was never converted ({CONVERTED_MANIFEST} missing).",
                f"delete {model_dir} and run `voicepipe models fetch {entry.name}`.",
            )
        files.update(json.loads(converted.read_text()))
    return files


def verify_model_dir(entry: ModelEntry, model_dir: Path, on_bytes: Any = None) -> None:
    """Check every file's sha256; raise ModelError naming the first bad or missing file."""
    refetch = f"delete {model_dir} and run `voicepipe models fetch {entry.name}`."
    for rel, want in expected_files(entry, model_dir).items():
        path = model_dir / rel
        if not path.is_file():
            raise ModelError(f"model {entry.name!r} is incomplete: {path} is missing.", refetch)
        got = sha256_file(path, on_bytes)
        if got != want:
            raise ModelError(
                f"checksum mismatch for {path} (model {entry.name!r}): expected {want[:12]}…, got {got[:12]}….",
                refetch,
            )


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
