"""Every command in docs/ exists: ``stare-lab`` subcommands are registered, scripts and config files named are in
the repository, ``-m`` modules import. (Placeholders in capitals such as ``GSM8K_TRAIN.jsonl``, ``$N`` or
``/shared/...`` paths of a user's cluster are arguments, not commands.)"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
REPO_DIRS = ("papers/", "scripts/", "tests/", "trainer/", "docs/", "stare_lab/", "simulators/", "analysis/")
#: modules of a framework that lives in its own virtual environment → the test that checks the docs' commands there
OTHER_ENV_MODULES = {"verl": "tests/integrations/verl/test_verl_docs.py"}


def _commands(path: Path) -> list[str]:
    """Shell commands of the ```bash blocks (continuation lines joined, comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        out += [ln.split(" #")[0].strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return out


def _subcommands() -> set[str]:
    from stare_lab.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(action.choices)


CASES = [(p.name, c) for p in DOCS for c in _commands(p)]


def test_docs_have_commands():
    assert any(name == "trainer.md" for name, _ in CASES)


@pytest.mark.parametrize("doc,cmd", CASES, ids=[f"{d}:{c[:40]}" for d, c in CASES])
def test_command_exists(doc, cmd):
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\$\(\(.*\)\)", cmd):  # a shell arithmetic assignment
        return
    words = shlex.split(cmd)
    while words and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # shell variable assignments (a launch script)
        words = words[1:]
    if not words:
        return
    if words[0].startswith((".venv-verl/bin/", ".venv/bin/")):  # a tool of one of the project's environments
        words[0] = words[0].rsplit("/", 1)[1]
    if words[0] in ("pip", "python3", "export", "cd", "."):
        if words[0] == "python3" and words[1:2] == ["-m"] and words[2] != "venv":
            other = OTHER_ENV_MODULES.get(words[2].split(".")[0])
            if other:  # checked in that environment, by that test
                assert (REPO / other).is_file(), other
            else:
                assert importlib.util.find_spec(words[2]) is not None, cmd
        return
    for w in words:  # every repository path a command names exists
        if w.startswith(REPO_DIRS):
            assert (REPO / w).exists(), f"{doc}: {w} does not exist ({cmd})"
    if words[0] == "stare-lab":
        args = words[1:]
        while args and args[0].startswith("-"):  # front-door options before the subcommand; --plugin takes a value
            args = args[2:] if args[0] == "--plugin" else args[1:]
        sub = args[0]
        assert sub in _subcommands(), f"{doc}: stare-lab {sub} is not a subcommand"
    elif words[0] in ("python", "bash"):
        if words[0] == "python" and words[1] == "-c":  # a one-liner (maybe for another environment): valid Python
            compile(words[2], cmd, "exec")
        elif words[1] == "-m":
            assert importlib.util.find_spec(words[2]) is not None, cmd
        else:
            assert (REPO / words[1]).is_file(), cmd
    elif words[0] in ("torchrun", "deepspeed"):
        mod = words[words.index("-m") + 1] if "-m" in words else words[words.index("--module") + 1]
        assert importlib.util.find_spec(mod) is not None, cmd
    elif words[0] == "accelerate":  # accelerate launch --config_file FILE USER_SCRIPT: the config file (above)
        assert words[1] == "launch" and "--config_file" in words, cmd
    elif words[0] in ("pytest",):
        assert (REPO / words[1]).exists(), cmd
    else:
        pytest.fail(f"{doc}: unknown command {words[0]!r} in {cmd!r}")
