"""The ``stare-lab`` front door: argument parsing and error printing only.

Each wing owns its subcommand in its own ``cli.py`` and registers it under the entry-point group
``stare_lab.commands`` (see ``pyproject.toml``). An entry point is a callable ``register(subparsers)`` that adds
one sub-parser and sets ``func`` (``func(args) -> int`` exit code) as its default. The core never imports its
callers: the commands are discovered with :mod:`importlib.metadata`. A subcommand whose wing cannot be imported
(extras not installed) still appears and says why it is unavailable.

Plugins (:mod:`stare_lab.platform.plugins`): ``--plugin NAME`` (repeatable; a module name or a path to a ``.py`` file) and
the installed entry points of group ``stare_lab.plugins`` are loaded after parsing, before any subcommand runs; a
plugin that fails to import is one error line naming it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from importlib import metadata
from typing import Sequence

from stare_lab import __version__
from stare_lab.errors import StareLabError
from stare_lab.platform.threads import set_thread_defaults

ENTRY_POINT_GROUP = "stare_lab.commands"

#: Subcommands the toolkit promises; each is provided by a wing through an entry point.
KNOWN_COMMANDS = {
    "simulate": "run tabular / small-transformer policy simulations (simulators)",
    "analyze": "plots and a report from run directories (analysis)",
    "promote": "turn simulated STARE settings into a trainer or verl config (trainer)",
    "train": "full-scale GRPO / STARE training with vLLM + DeepSpeed (trainer)",
    "evaluate": "score a checkpoint on the math benchmarks (trainer)",
}


def _unavailable(name: str, reason: str):
    def run(args: argparse.Namespace) -> int:
        print(f"stare-lab {name}: not available: {reason}", file=sys.stderr)
        return 2

    return run


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every discovered subcommand."""
    parser = argparse.ArgumentParser(
        prog="stare-lab",
        description="stare_lab: entropy-preserving RL post-training (STARE) — simulate, analyze, train, evaluate.",
    )
    parser.add_argument("--version", action="version", version=f"stare-lab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE (a module name or a path to a .py file) before the command runs, e.g. to "
                             "register a loss and its method (repeatable; docs/extending.md)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    registered: set[str] = set()
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # noqa: BLE001 - broken metadata must not break --help
        eps = []
    for ep in sorted(eps, key=lambda e: e.name):
        if ep.name in registered:
            continue
        try:
            register = ep.load()
            register(sub)
        except Exception as err:  # noqa: BLE001 - a broken or uninstalled wing only disables its command
            p = sub.add_parser(ep.name, help=KNOWN_COMMANDS.get(ep.name, "") + " [unavailable]")
            p.set_defaults(func=_unavailable(ep.name, f"{type(err).__name__}: {err}"))
        registered.add(ep.name)
    for name, help_text in KNOWN_COMMANDS.items():
        if name not in registered:
            p = sub.add_parser(name, help=help_text + " [not installed]")
            p.set_defaults(func=_unavailable(name, "no installed package provides this command"))
    return parser


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The sub-parser of ``command`` (``parser`` itself when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 error, 2 usage/unavailable).

    A command that sets the default ``extra_overrides=[]`` receives trailing ``key=value`` words given after its
    options there (e.g. ``stare-lab promote RUN --method c2 ... optim.lr=2e-6``).
    """
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # dotted key=value overrides may follow the options of a command that takes them (it sets a default
        # `extra_overrides=[]`); anything else is a usage error, as with parse_args
        if getattr(args, "extra_overrides", None) is not None and all(
            "=" in u and not u.startswith("-") for u in unknown
        ):
            args.extra_overrides = list(args.extra_overrides) + unknown
        else:  # the usage of the subcommand the words were given to (argparse would print the top level's)
            _command_parser(parser, getattr(args, "command", None)).error(
                f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    set_thread_defaults()  # before any command imports torch (stare_lab.platform.threads)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None  # cleans up as Ctrl-C does
    _HANDLER_PID.append(os.getpid())
    try:
        from stare_lab.platform.plugins import load_plugins
        from stare_lab.selection import native_enabled

        native_enabled()  # a bad STARE_LAB_NATIVE is one line before any work (it is read mid-run otherwise)
        load_plugins(args.plugin)
        return int(args.func(args) or 0)
    except StareLabError as err:
        print(f"stare-lab {args.command}: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`stare-lab ... | head`): not an error of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 141
    except KeyboardInterrupt as err:
        term = isinstance(err, Terminated)
        again = " (continue it with the same command and --resume)" if args.command in _RESUMABLE else ""
        print(f"stare-lab {args.command}: {'terminated' if term else 'interrupted'}{again}", file=sys.stderr)
        return 128 + (signal.SIGTERM if term else signal.SIGINT)
    finally:
        _HANDLER_PID.pop()
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


#: the subcommands that continue an interrupted run with ``--resume``
_RESUMABLE = ("simulate", "train", "evaluate")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a scheduler), raised in the main thread like Ctrl-C's KeyboardInterrupt so
    that the same clean-up runs: worker processes stopped, locks released; the command exits 143."""


#: The process that installed the SIGTERM handler (a forked child inherits the handler, not the role).
_HANDLER_PID: list[int] = []


def _raise_terminated(signum: int, frame: object) -> None:
    if _HANDLER_PID and os.getpid() != _HANDLER_PID[-1]:  # a forked worker (a Pool's, a simulator's): the default
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
