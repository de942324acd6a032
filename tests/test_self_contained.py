"""The repository stands on its own: no tracked file points outside it.

A clone must work with nothing beside it, so no tracked file may name the developers' notes folder that used to
sit beside the repository (as a relative path, as a path component built in code, or through one of its files) or
an absolute path under the machine's work directory. The patterns are assembled from pieces so that this file does
not match itself; the last tests check that they catch the forms they target and leave ordinary text alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
S = "sha" + "red"  # the folder name, never written out whole in a pattern below
W = "wo" + "rk"

#: (what it catches, regex)
PATTERNS = [
    ("a relative path to a sibling folder", re.compile(r"\.\./" + S + r"\b")),
    ("an absolute path under /" + W, re.compile(r"(?<![\w.-])/" + W + r"/")),
    ("a file of the developer notes folder",
     re.compile(S + r"/(?:data|hooks|science\.md|design\.md|style\.md|environment\.md|paper_table2\.csv)\b")),
    ("a path component built in code", re.compile(r"""/\s*["']""" + S + r"""["']|["']""" + S + r"""["']\s*/""")),
    ("the notes' science file (cite docs/theory.md)", re.compile(r"(?<![\w/])" + "sci" + r"ence\.md\b")),
    ("the notes' design file (cite docs/design.md)", re.compile(r"(?<![\w/])" + "des" + r"ign\.md\b")),
]

#: Lines that are known to be fixed by another change in flight (exact text, file → lines). Each entry must still
#: be present (so a stale entry fails too); remove the entry when that change lands.
PENDING: dict[str, set[str]] = {}


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("not a git checkout (or no git): cannot list the tracked files")
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f]


def _hits(text: str) -> list[tuple[int, str, str]]:
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for what, rx in PATTERNS:
            if rx.search(line):
                found.append((lineno, what, line.strip()))
    return found


def test_no_tracked_file_points_outside_the_repository():
    bad, pending_seen = [], {}
    files = _tracked_files()
    for rel in files:
        path = REPO / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for lineno, what, line in _hits(text):
            if line in PENDING.get(rel, set()):
                pending_seen.setdefault(rel, set()).add(line)
                continue
            bad.append(f"{rel}:{lineno}: {what}: {line[:160]}")
    assert not bad, "tracked files point outside the repository:\n" + "\n".join(bad)
    stale = {rel: lines - pending_seen.get(rel, set()) for rel, lines in PENDING.items()}
    stale = {k: v for k, v in stale.items() if v}
    assert not stale, f"PENDING entries no longer present (remove them): {stale}"


@pytest.mark.parametrize("line", [
    "GSM8K = REPO.parent / \"" + S + "\" / \"data\" / \"gsm8k\" / \"train.jsonl\"",
    "see ../" + S + "/data/benchmarks",
    "Path(\"/" + W + "/" + S + "/paper_table2.csv\")",
    "the math is in `" + S + "/" + "sci" + "ence.md`",
    "(" + "sci" + "ence.md §2)",
    "contracts in " + "des" + "ign.md §4",
])
def test_patterns_catch_the_forms_they_target(line):
    assert _hits(line), line


@pytest.mark.parametrize("line", [
    "(docs/theory.md §2)", "docs/design.md §4", "prompt KV shared across a group", "on a shared machine",
    "out_dir=/mnt/runs/o1",
])
def test_patterns_leave_ordinary_text_alone(line):
    assert not _hits(line), line
