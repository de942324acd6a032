"""`stare-lab ... | head`: a reader that goes away mid-output is not an error of the command: exit 141 (the shell's
code for SIGPIPE), no traceback, and stdout redirected so that Python's final flush raises nothing."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import simulators.cli as sim
import stare_lab.cli as cli

def broken(args):
    print("first line", flush=True)
    raise BrokenPipeError(32, "Broken pipe")

sim.handler = broken  # the front door registers simulate's handler when it builds its parser
sys.exit(cli.main(["simulate", "--list-presets"]))
"""


def test_broken_pipe_is_exit_141_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 141 and proc.stdout == "first line\n", (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
