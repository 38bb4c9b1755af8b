"""The ``coevolve`` command.

Heavy libraries are imported inside the commands that need them, so
``coevolve --help`` stays fast.
"""

from __future__ import annotations

import os
import sys

import typer

from .commands.agent import bootstrap_command, eval_command
from .commands.bench import bench_app
from .commands.common import err_console
from .commands.config import config_app
from .commands.env import env_app
from .commands.run import export_command, run_command
from .commands.serve import serve_command
from .commands.studio import studio
from .commands.synthesis import synthesize_command
from .common.errors import is_known_error

app = typer.Typer(
    help="Train LLM agents by agent-data mutual evolution.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(env_app, name="env")
app.add_typer(config_app, name="config")
app.add_typer(bench_app, name="bench")
app.command("bootstrap")(bootstrap_command)
app.command("eval")(eval_command)
app.command("synthesize")(synthesize_command)
app.command("run")(run_command)
app.command("export")(export_command)
app.command("studio")(studio)
app.command("serve")(serve_command)


def main() -> None:
    # A person sees coevolve's stage lines and one bar per stage; the libraries' own
    # bars (weight loading, dataset maps, GGUF dequantisation) would interleave with them.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # read by tqdm at import: GGUF dequantisation
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as err:  # boundary: a known error is one line, a bug its traceback
        if "--debug" in sys.argv[1:] or not is_known_error(err):
            raise
        from rich.markup import escape

        message = " ".join(str(err).split())
        err_console.print(
            f"[red]error:[/red] {escape(message)} (--debug shows the traceback)", soft_wrap=True
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
