"""Resolve a model spec (default name, local path, or hub id) to files on disk."""

from __future__ import annotations

from pathlib import Path

from voicepipe.errors import ModelError
from voicepipe.models.manifest import CONVERTED_MANIFEST, ModelEntry, expected_files, load_manifest


def resolve_model(spec: str, kind: str, models_dir: Path) -> Path:
    """Return the directory (or file) that holds the model named by ``spec``.

    - a default model name from the manifest -> ``models_dir/NAME`` (must have been fetched);
    - an existing local path -> that path;
    - anything of the form ``org/name`` -> a snapshot from the Hugging Face hub (cached locally).
    """
    manifest = load_manifest()
    if spec in manifest:
        entry = manifest[spec]
        if entry.kind != kind:
            raise ModelError(f"model {spec!r} is a {entry.kind} model, not a {kind} model.",
                             f"set models.{kind} to a {kind} model.")
        model_dir = models_dir / spec
        missing = _first_missing_file(entry, model_dir)
        if missing:
            raise ModelError(f"{kind} model {spec!r} is not in {models_dir} ({missing} missing).",
                             "run `voicepipe models fetch` (or `make models`).")
        return model_dir
    local = Path(spec).expanduser()
    if local.exists():
        return local
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return download_from_hub(spec, kind)
    raise ModelError(f"{kind} model {spec!r} is neither a default model, a local path, nor a hub id.",
                     f"use one of {', '.join(n for n, e in manifest.items() if e.kind == kind)}, "
                     "an existing directory, or ORG/NAME.")


def _first_missing_file(entry: ModelEntry, model_dir: Path) -> str | None:
    """A cheap presence check for load time; `voicepipe models verify` does the full checksums."""
    try:
        files = expected_files(entry, model_dir)
    except ModelError:
        return CONVERTED_MANIFEST
    return next((rel for rel in files if not (model_dir / rel).is_file()), None)


def download_from_hub(repo_id: str, kind: str) -> Path:
    """Download (or reuse the local cache of) a hub snapshot; a clear error when the hub is unreachable."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=repo_id))
    except LocalEntryNotFoundError:
        raise ModelError(
            f"{kind} model {repo_id!r} is not in the local hub cache and the hub cannot be reached.",
            "connect to huggingface.co, or download the model elsewhere and set the model to its directory.",
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        raise ModelError(f"could not fetch {kind} model {repo_id!r} from the hub: {exc.__class__.__name__}.",
                         "check the hub id and the network, or point the setting at a local directory.") from None
