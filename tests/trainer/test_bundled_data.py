"""The data bundled with the package (trainer/assets/): record counts and checksums as its README states, the
normalized record format, and every file declared as package data (so a non-editable ``pip install .`` has it)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
from pathlib import Path

import pytest

from trainer.evaluation.benchmarks import BUNDLED_DIR, GSM8K_TRAIN_SAMPLE, default_data_dir, load_benchmark

ASSETS = BUNDLED_DIR.parent
REPO = Path(__file__).resolve().parents[2]

#: file → (records, sha256), typed in from the provenance table of trainer/assets/README.md
EXPECTED = {
    "benchmarks/aime24.jsonl": (30, "d82a1a0926532ca1bcd9dd5a5ea5bad4641e060fcfa154c965fb9085b9d1f0a9"),
    "benchmarks/aime25.jsonl": (30, "b7155512c8d2e94a1a697f62ef49a7ef2822c487abc96a9b3d8cfd2a0119fcbf"),
    "benchmarks/amc23.jsonl": (40, "cffc263133954dcf5b0c1592fc27f8e9fc45934d5896d3aad26ac6282fc32e37"),
    "benchmarks/math500.jsonl": (500, "9123502501bea792063f3059a87a170d4905689edbfe3133deb591a027b376db"),
    "benchmarks/minerva_math.jsonl": (272, "6f1f95e39e2b505a3a23bc9bd03f0a300e9db187600c8f335b0dc5a59d46d9fb"),
    "benchmarks/olympiadbench.jsonl": (675, "7b37229486c605c86118981b1c3454b7b3cde35e0f11ef5b113a5e4558c237fe"),
    "benchmarks/gsm8k.jsonl": (1319, "ac3971d712de8865c09872570a0a31968dec685dc9245b442ea24902ebafb816"),
    "gsm8k_train_sample.jsonl": (1000, "847e8314bab6d02a057f5f0761847fce68a137cde412553227aeeeea0c95f9fc"),
}


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_counts_checksums_and_record_format(rel):
    path = ASSETS / rel
    n, sha = EXPECTED[rel]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == n
    assert all(set(r) == {"id", "problem", "answer", "source"} and r["answer"].strip() for r in rows)
    assert len({r["id"] for r in rows}) == n
    readme = (ASSETS / "README.md").read_text()
    assert f"`{rel}`" in readme and sha in readme  # the provenance table names the file with this checksum


def test_every_bundled_file_is_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["trainer"]
    files = [p.relative_to(ASSETS.parent).as_posix() for p in ASSETS.rglob("*") if p.is_file()]
    assert files and all(any(fnmatch.fnmatchcase(f, pat) for pat in spec) for f in files), (files, spec)
    assert sum(p.stat().st_size for p in ASSETS.rglob("*") if p.is_file()) < 3 * 2**20  # a few MB at most


def test_defaults_read_the_bundled_copies(monkeypatch):
    monkeypatch.delenv("STARE_LAB_BENCHMARK_DIR", raising=False)
    assert default_data_dir() == BUNDLED_DIR
    first = load_benchmark("aime24")[0]  # AIME 2024 I, problem 1 (Aya's walk): answer 204
    assert first.problem.startswith("Every morning Aya goes for a $9$-kilometer-long walk") and first.answer == "204"
    assert GSM8K_TRAIN_SAMPLE.is_file()
