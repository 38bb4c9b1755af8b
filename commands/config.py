"""``coevolve config``: inspect configuration."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import SetOption, load_config_or_fail

config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)


@config_app.command("show")
def config_show(
    path: Annotated[
        str | None, typer.Argument(help="YAML config (default: built-in defaults).")
    ] = None,
    overrides: SetOption = None,
) -> None:
    """Validate a config and print it with every default filled in (and --set applied)."""
    import yaml

    config = load_config_or_fail(path, overrides or [])
    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")


@config_app.command("schema")
def config_schema() -> None:
    """Print the config's JSON Schema: every section and field, with its type, default and
    description (for an editor's YAML completion or a validator)."""
    import json

    from ..config import CoevolveConfig

    print(json.dumps(CoevolveConfig.model_json_schema(), indent=2))
