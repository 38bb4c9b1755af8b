"""The command line of the scripted OpenAI servers, a manual echo server:
``python -m coevolve.testing.server_cli`` (threaded) and
``python -m coevolve.testing.async_openai_server`` (asyncio)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from .openai_script import Script, calls_then_answer
from .openai_server import DEFAULT_MODEL, ScriptedOpenAIServer


def server_from_args(
    argv: Sequence[str] | None = None, prog: str = "python -m coevolve.testing.server_cli"
) -> tuple[ScriptedOpenAIServer, argparse.Namespace]:
    """The server the command line asks for (not started), and the parsed arguments."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="A local OpenAI-compatible server that echoes (or repeats one reply).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds per chat completion")
    parser.add_argument("--model", action="append", help="model name served (repeatable)")
    parser.add_argument("--any-model", action="store_true", help="accept every model name")
    parser.add_argument("--echo", action="store_true", help="echo the last user message (default)")
    parser.add_argument("--reply", help="answer every chat completion with this text instead")
    parser.add_argument("--api-key", help="require this bearer key")
    parser.add_argument(
        "--calls-then-answer",
        type=int,
        metavar="N",
        help="call get_balance until the conversation has N tool results, then answer",
    )
    args = parser.parse_args(argv)
    script: Script | None = [args.reply] if args.reply is not None else None
    if args.calls_then_answer is not None:
        script = calls_then_answer(args.calls_then_answer)
    server = ScriptedOpenAIServer(
        script,
        delay_s=args.delay,
        models=args.model or (DEFAULT_MODEL,),
        repeat_last=True,
        accept_any_model=args.any_model,
        api_key=args.api_key,
        host=args.host,
        port=args.port,
    )
    return server, args


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until Ctrl-C."""
    server, _ = server_from_args(argv)
    with server:
        print(f"serving {', '.join(server.models)} at {server.base_url} (Ctrl-C stops)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
