"""Model registry: the manifest of default models, fetching, verification and spec resolution."""

from voicepipe.models.fetch import fetch_models
from voicepipe.models.manifest import ModelEntry, dir_size, load_manifest, verify_model_dir
from voicepipe.models.registry import download_from_hub, resolve_model

__all__ = [
    "ModelEntry",
    "dir_size",
    "download_from_hub",
    "fetch_models",
    "load_manifest",
    "resolve_model",
    "verify_model_dir",
]
