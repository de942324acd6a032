"""The stare-lab front door: --version, --help on every subcommand, clean errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

import stare_lab
from stare_lab.cli import KNOWN_COMMANDS, build_parser, main


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert stare_lab.__version__ in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(KNOWN_COMMANDS))
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert command in capsys.readouterr().out


def test_all_commands_registered():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(KNOWN_COMMANDS) <= set(sub.choices)


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "stare_lab.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and stare_lab.__version__ in out.stdout


def test_import_needs_only_torch_and_numpy():
    """`import stare_lab` (and its math modules) must not pull in the heavy optional libraries."""
    code = (
        "import sys, stare_lab, stare_lab.config, stare_lab.platform.runs;"
        "import importlib, importlib.util;"
        "[importlib.import_module(m) for m in ('stare_lab.loss.losses','stare_lab.loss.stare','stare_lab.loss.entropy',"
        "'stare_lab.loss.advantages','stare_lab.theory.first_order','stare_lab.theory.decomposition','stare_lab.theory.critical') if importlib.util.find_spec(m)];"
        "heavy=[m for m in ('transformers','deepspeed','vllm','matplotlib','scipy','math_verify','yaml') "
        "if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
