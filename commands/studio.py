"""``coevolve studio``: serve the graphs to LangGraph Studio."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from .common import PACKAGE_DIR, console, fail


def studio(
    port: Annotated[int, typer.Option(help="Port of the local LangGraph server.")] = 2024,
    browser: Annotated[bool, typer.Option(help="Open Studio in a browser.")] = False,
) -> None:
    """Serve the graphs to LangGraph Studio (langgraph dev on 127.0.0.1, offline-safe)."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    executable = shutil.which("langgraph") or str(Path(sys.executable).parent / "langgraph")
    if not Path(executable).exists():
        raise fail(
            "the langgraph CLI is missing; install the studio extra: pip install 'coevolve[studio]'"
        )
    config = PACKAGE_DIR / "langgraph.json"
    env = {**os.environ, "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGGRAPH_NO_VERSION_CHECK": "true"}
    api = f"http://127.0.0.1:{port}"
    console.print(f"API:    {api}  (health: {api}/ok)")
    console.print(f"Studio: https://smith.langchain.com/studio/?baseUrl={api}")
    command = [executable, "dev", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--config", str(config), "--allow-blocking"]
    if not browser:
        command.append("--no-browser")
    try:
        raise typer.Exit(subprocess.call(command, cwd=config.parent, env=env))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
