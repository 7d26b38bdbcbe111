"""The `voicepipe` command: serve, config, models (later: call, replay, bench)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.table import Table

from voicepipe.config import Settings, load_settings, masked_dump
from voicepipe.errors import VoicepipeError

app = typer.Typer(help="voicepipe: a one-process voice-agent service.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
config_app = typer.Typer(help="Inspect the effective settings.", no_args_is_help=True)
models_app = typer.Typer(help="Fetch, list and verify models.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")

console = Console()
err_console = Console(stderr=True)


class _State:
    config_file: Path | None = None
    set_pairs: list[str] = []
    debug: bool = False


state = _State()


@app.callback()
def main(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML settings file.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a setting, e.g. --set server.port=9000 (repeatable).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks on errors.")] = False,
) -> None:
    state.config_file = config
    state.set_pairs = set_ or []
    state.debug = debug


def settings_with(**overrides) -> Settings:
    """The effective settings: flags given to a command win over --set, env and the TOML file."""
    tree: dict = {}
    for dotted, value in overrides.items():
        if value is None:
            continue
        section, _, key = dotted.partition("__")
        tree.setdefault(section, {})[key] = value
    return load_settings(state.config_file, overrides=tree, set_pairs=state.set_pairs)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
) -> None:
    """Start the service (models load in the background; /ready turns true when done)."""
    import uvicorn

    from voicepipe.server import create_app

    settings = settings_with(server__host=host, server__port=port, device__device=device)
    logging.basicConfig(level=settings.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app_ = create_app(settings)
    app_.state.runtime.model_paths()  # fail fast, with one clear line, when a model is missing
    uvicorn.run(app_, host=settings.server.host, port=settings.server.port,
                log_level=settings.server.log_level)


@config_app.command("show")
def config_show() -> None:
    """Print the effective settings as JSON, secrets masked."""
    print(json.dumps(masked_dump(settings_with()), indent=2))


@models_app.command("fetch")
def models_fetch(
    names: Annotated[list[str] | None, typer.Argument(help="Default models to fetch (all).")] = None,
) -> None:
    """Download, verify and unpack the default models into the models directory."""
    from voicepipe.models import fetch_models

    settings = settings_with()
    fetch_models(settings.paths.models_dir, names)


@models_app.command("list")
def models_list() -> None:
    """Show the default models, whether they are present, and their sizes."""
    from voicepipe.models import dir_size, load_manifest

    models_dir = settings_with().paths.models_dir
    table = Table("name", "kind", "present", "size", "description")
    for name, entry in load_manifest().items():
        path = models_dir / name
        present = path.is_dir()
        size = f"{dir_size(path) / 1e6:.1f} MB" if present else "-"
        table.add_row(name, entry.kind, "yes" if present else "no", size, entry.description)
    console.print(table)
    console.print(f"models directory: {models_dir}")


@models_app.command("verify")
def models_verify(
    names: Annotated[list[str] | None, typer.Argument(help="Models to check (all present).")] = None,
) -> None:
    """Check every file of the fetched models against its sha256."""
    from voicepipe.models import load_manifest, verify_model_dir

    models_dir = settings_with().paths.models_dir
    for name, entry in load_manifest().items():
        if names and name not in names:
            continue
        if not (models_dir / name).is_dir():
            console.print(f"- {name} not fetched")
            continue
        verify_model_dir(entry, models_dir / name)
        console.print(f"[green]✓[/] {name}")


def run() -> None:
    """Console-script entry point: one clear line for expected errors, a traceback only with --debug."""
    try:
        app(standalone_mode=False)
    except VoicepipeError as exc:
        if state.debug:
            raise
        err_console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(130)


if __name__ == "__main__":
    run()
