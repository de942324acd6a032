"""The command line sets its own environment: OMP_NUM_THREADS=1 before torch is imported unless the user set it (a
trainer step after `. .venv/bin/activate` runs as under make), and the DeepSpeed op cache is one fixed folder built
with the environment's own tools (no rebuild when make and activated runs alternate)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = ("import os, sys\nfrom stare_lab.cli import main\nmain(['simulate', '--seeds', '0'])\nimport torch\n"
         "print(os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())\n")


def _probe(env: dict) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    return proc.stdout.split()


def test_front_door_sets_one_thread_unless_the_user_did():
    """Unset: torch starts with 1 thread (its default is one per core: 2 here, so the check can fail); a user's
    OMP_NUM_THREADS=2 is kept (torch caps its pool at the cores: 2 here)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    assert _probe(env) == ["1", "1"]
    assert _probe({**env, "OMP_NUM_THREADS": "2"}) == ["2", "2"]


def test_op_cache_and_tools_are_the_environments(monkeypatch):
    from trainer.engines.launch import cpu_env_defaults, extensions_dir

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    cpu_env_defaults()
    want = Path(sys.prefix) / "torch_extensions" if sys.prefix != sys.base_prefix else extensions_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(want)
    assert os.environ["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin", "/bin"]
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/tmp/mine")
    cpu_env_defaults()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == "/tmp/mine"
