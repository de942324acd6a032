"""The user documentation: the README's first screen, links that resolve, and demo output quoted as it is printed.

- The README's first screen (its first 40 lines and 2,000 characters) holds the install line, the demo command
  and then a markdown link into docs/ — the layout the project chose for a newcomer.
- Every relative markdown link in README.md, docs/*.md and papers/*/README.md names a file of the repository, and
  an anchor names a heading of that file (GitHub's heading ids).
- The demo's verdict and table quoted in README.md and docs/quickstart.md are what `stare-lab simulate --preset
  demo` prints: the test reruns the demo (the seeds fix every number) and finds each quoted line in the output.
- No tracked file points to the benchmarks page's former place at the top of the repository.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

#: docs pages that other work in flight adds; links to them may dangle until then
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _doc_files() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "papers").glob("*/README.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def _slug(heading: str) -> str:
    """GitHub's id of a markdown heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = _slug(m.group(1))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
    return out


def _code_blocks(text: str) -> list[list[str]]:
    blocks, cur = [], None
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if cur is None:
                cur = []
            else:
                blocks.append(cur)
                cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def test_readme_first_screen_has_install_demo_then_docs_link():
    """The first 40 lines and first 2,000 characters of README.md hold the install line (a `pip install`), the
    demo command (`make demo`) and the test command, and a markdown link into docs/ after the demo command."""
    text = README.read_text(encoding="utf-8")
    screen = "\n".join(text.splitlines()[:40])[:2000]
    demo = screen.find("make demo")
    assert demo >= 0, "README's first screen lacks the demo command `make demo`"
    assert "pip install" in screen, "README's first screen lacks the install line"
    assert "make test" in screen, "README's first screen lacks the test command `make test`"
    docs_link = re.search(r"\]\(docs/[^)]+\)", screen[demo:])
    assert docs_link, "README's first screen has no markdown link into docs/ after `make demo`"


def test_relative_links_and_anchors_resolve():
    """Each relative link target exists (relative to the linking file); an anchor #x names a heading of the target
    (or of the same file). External links (a scheme such as https:) are not followed."""
    bad = []
    for doc in _doc_files():
        for n, line in _prose_lines(doc.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue
                path_part, _, anchor = target.partition("#")
                dest = (doc.parent / path_part).resolve() if path_part else doc
                rel = os.path.relpath(dest, REPO)
                where = f"{doc.relative_to(REPO)}:{n}: {target}"
                if not dest.exists():
                    bad.append(f"{where}: no such file")
                    continue
                if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    bad.append(f"{where}: no heading with id {anchor!r} in {rel}")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_slug_follows_github_ids():
    """Ids worked out by hand from GitHub's rule (lower case; punctuation other than - and _ dropped; spaces to -)."""
    assert _slug("A.1 A fresh clone to the demo") == "a1-a-fresh-clone-to-the-demo"
    assert _slug("Environment variables") == "environment-variables"
    assert _slug("§3 Trainer (`trainer/`)") == "3-trainer-trainer"
    assert _slug("1. Simulate: what the demo shows") == "1-simulate-what-the-demo-shows"


def test_no_reference_to_the_former_benchmarks_file():
    """The benchmarks page lives in docs/benchmarks.md; no tracked file names the old top-level file."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("not a git checkout (or no git): cannot list the tracked files")
        pytest.skip("not a git checkout")
    old = "BENCH" + "MARKS.md"  # assembled so that this file does not match itself
    assert not (REPO / old).exists()
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    hits = []
    for rel in filter(None, files.split("\0")):
        try:
            text = (REPO / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1) if old in line]
    assert not hits, f"tracked files still name {old}: {hits}"


def _quoted_demo_lines(path: Path) -> list[str]:
    """The lines of the code block that quotes the demo's output (the block holding the table header)."""
    for block in _code_blocks(path.read_text(encoding="utf-8")):
        if any(line.startswith("method ") for line in block):
            return [line for line in block if line.strip()]
    raise AssertionError(f"{path.relative_to(REPO)} quotes no demo table")


def test_quoted_demo_output_is_what_the_demo_prints(tmp_path, capsys):
    """README.md and docs/quickstart.md quote `stare-lab simulate --preset demo` (seeds 0-2, deterministic): each
    quoted line is a line of a fresh run's output, or, where the quote ends in '...', the start of one."""
    from stare_lab.cli import main

    rc = main(["simulate", "--preset", "demo", "--out", str(tmp_path / "demo"), "--no-plots"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    missing = []
    for doc in (README, REPO / "docs" / "quickstart.md"):
        for line in _quoted_demo_lines(doc):
            if line.endswith(" ..."):
                ok = any(o.startswith(line[:-4]) for o in out)
            else:
                ok = line in out
            if not ok:
                missing.append(f"{doc.relative_to(REPO)}: {line}")
    assert not missing, "quoted lines the demo does not print:\n" + "\n".join(missing) + "\n--- output:\n" + \
        "\n".join(out)
