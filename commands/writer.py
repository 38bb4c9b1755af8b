"""``coevolve writer``: teach the task writer from a config's seed tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from .common import CacheDirOption, DebugOption, SetOption, console, fail, load_config_or_fail


def writer_command(
    config_path: Annotated[
        str | None,
        typer.Argument(help="Run config (default: configs/quickstart.yaml's defaults)."),
    ] = None,
    base: Annotated[
        str | None,
        typer.Option(help="Override writer.base: smollm2, bootstrap or a model directory."),
    ] = None,
    cache_dir: CacheDirOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the writer's metadata as JSON.")
    ] = False,
    path_only: Annotated[
        bool,
        typer.Option(
            "--path", help="Print only the writer's directory (for endpoints.writer.model)."
        ),
    ] = False,
    overrides: SetOption = None,
    debug: DebugOption = False,
) -> None:
    """Teach the task writer (SmolLM2 + LoRA) on the config's seed tasks: calls -> request.

    It learns from the seed tasks only (env.split, the first pool.seed_tasks of them), never
    a validation or held-out task. Serve the printed directory (``transformers serve``, or
    vLLM) and name that endpoint in ``synthesis.roles.writer``. Cached: a second call with
    the same settings and tasks returns at once.
    """
    from ..envs.registry import get_environment
    from ..loop.compose import seed_tasks
    from ..training.bootstrap.bootstrap_config import default_cache_dir

    config = load_config_or_fail(config_path, overrides or ())
    settings = config.writer if base is None else config.writer.model_copy(update={"base": base})
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if settings.base == "smollm2":
        from ..training.bootstrap.smollm2 import BaseModelError, base_model_dir

        try:
            base_dir = base_model_dir(root, progress=not (as_json or path_only))
        except BaseModelError as err:
            raise fail(str(err)) from None
    elif settings.base == "bootstrap":
        from ..training.bootstrap.build import bootstrap

        base_dir = bootstrap(config.bootstrap, cache_dir=root, progress=not (as_json or path_only))
    else:
        base_dir = Path(settings.base).expanduser()
        if not (base_dir / "config.json").is_file():
            raise fail(
                f"writer.base {settings.base!r} is not smollm2, bootstrap or a model directory"
            )
    seeds = seed_tasks(config)
    from ..training.writer_model import METADATA_FILE, build_writer

    try:
        path = build_writer(
            settings,
            base_dir=base_dir,
            tasks=seeds,
            make_env=get_environment(config.env.name).environment,
            cache_dir=root,
            progress=not (as_json or path_only),
        )
    except ValueError as err:
        raise fail(str(err)) from None
    linked = _link_for_endpoint(config, path)
    metadata = json.loads((path / METADATA_FILE).read_text())
    if path_only:
        print(path)
        return
    if as_json:
        print(json.dumps({"path": str(path), **metadata}))
        return
    console.print(f"task writer: {path}")
    if linked is not None:
        console.print(
            f"  linked as {linked}, the model of endpoint {config.synthesis.roles.writer!r}"
        )
    console.print(
        f"  taught on {metadata['examples']} seed tasks, {metadata['steps']} steps, "
        f"final loss {metadata['final_loss']:.3f}"
    )
    console.print(
        "  serve it: an endpoint with server: transformers and this directory as its model, "
        "then `coevolve serve CONFIG --endpoint writer` (docs/synthesis.md)"
    )


def _link_for_endpoint(config: Any, built: Path) -> Path | None:
    """Point the path the writer's endpoint names as its model at the built writer, so a
    config can name a stable path (``runs/writer-n100``) that ``coevolve serve`` serves and
    the roles ask for. A path that exists and is not a link is left alone (an error)."""
    name = config.synthesis.roles.writer
    if name is None or name not in config.endpoints:
        return None
    link = Path(config.endpoints[name].model)
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        if link.resolve() == built.resolve():
            return link
        raise fail(
            f"endpoints.{name}.model {str(link)!r} exists and is not a link to a writer: "
            "name another path, or remove it"
        )
    elif not (link.is_absolute() or str(link).startswith(".") or "/" in str(link)):
        return None  # a served model's name, not a path: the user serves it their way
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(built.resolve(), target_is_directory=True)
    return link
