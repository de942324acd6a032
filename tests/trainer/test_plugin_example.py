"""The plugin example of docs/extending.md, run from the shell as a user would: the code block is written to a file
outside the repository, then ``stare-lab --plugin FILE simulate``, ``stare-lab analyze`` on its output, and one
trainer step of the tiny CPU model with the config's ``plugins`` list (and ``method`` alone selecting the loss); an
installed entry point (a ``.dist-info`` folder on ``PYTHONPATH``) loads it without any option. No project file is
edited (checked: sizes and modification times of every project file before and after).

Hand-derived check (the loss's definition, docs/extending.md): at step 1 both simulator runs sample the same
rollouts, and on-policy (ρ = 1, nothing clipped) W-REINFORCE's update is GRPO's with the Â > 0 part scaled by λ, so
the entropy change carried by the positive-advantage quadrants is λ × GRPO's and the negative quadrants are equal
(to float32 rounding of the loss's gradient: rel 1e-6). Its metric ``loss/pos_token_frac`` is the share of tokens
with Â > 0, which the simulator also counts on its own (``quadrant/pos_*/count`` over S·G·L tokens).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)

REPO = runs.REPO
STARE_LAB = str(Path(sys.executable).with_name("stare-lab"))
LAM = 0.25
SMALL = ["num_prompts=8", "seq_len=3", "vocab_size=6", "threshold=2"]  # S = 8, G = 8 (the preset's), L = 3



def _need(module: str):
    """Import ``module``; skip if missing, but fail under CI=true (tests must not skip silently there)."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def example_code() -> str:
    """The python block that follows the ``<!-- example: w_reinforce.py -->`` marker of docs/extending.md."""
    text = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- example: w_reinforce\.py -->\n```python\n(.*?)```", text, re.S)
    assert match, "docs/extending.md lost its example block"
    return match.group(1)


def _changed(before: dict[str, tuple[int, int]]) -> list[str]:
    """Project files added, removed or modified since ``before`` (editing the checkout while the test runs shows up
    here too)."""
    after = _project_files()
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def _project_files() -> dict[str, tuple[int, int]]:
    out = {}
    for pkg in ("stare_lab", "simulators", "trainer", "analysis", "docs"):
        for p in (REPO / pkg).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts:
                st = p.stat()
                out[str(p.relative_to(REPO))] = (st.st_size, st.st_mtime_ns)
    st = (REPO / "pyproject.toml").stat()
    out["pyproject.toml"] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def plugin_dir(tmp_path) -> Path:
    """A folder outside the repository holding the example as ``w_reinforce.py``."""
    d = tmp_path / "user"
    d.mkdir()
    (d / "w_reinforce.py").write_text(example_code(), encoding="utf-8")
    return d


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_the_example_is_short():
    assert len(example_code().strip().splitlines()) <= 30


def test_example_plugin_simulate_and_analyze_from_the_shell(plugin_dir):
    _need("matplotlib")
    before = _project_files()
    out = plugin_dir / "runs" / "wr"
    runs.run([STARE_LAB, "--plugin", "./w_reinforce.py", "simulate", "--preset", "collapse", "--methods",
              "grpo,w-reinforce", "--seeds", "1", "--steps", "3", "--out", str(out), "--no-plots", *SMALL,
              f"loss.params.lam={LAM}"], cwd=plugin_dir)
    grpo, wr = _rows(out / "grpo" / "seed0")[0], _rows(out / "w-reinforce" / "seed0")[0]
    assert wr["entropy"] == grpo["entropy"] and wr["reward"] == grpo["reward"]  # the same start and rollouts
    for q in ("pos_high", "pos_low"):
        assert grpo[f"quadrant/{q}/dH"] != 0
        assert wr[f"quadrant/{q}/dH"] == pytest.approx(LAM * grpo[f"quadrant/{q}/dH"], rel=1e-6)
    for q in ("neg_high", "neg_low"):
        assert wr[f"quadrant/{q}/dH"] == pytest.approx(grpo[f"quadrant/{q}/dH"], rel=1e-6)
    n_pos = wr["quadrant/pos_high/count"] + wr["quadrant/pos_low/count"]
    assert wr["loss/pos_token_frac"] == pytest.approx(n_pos / (8 * 8 * 3), abs=1e-7)
    assert wr["loss/clipfrac_high"] == 0.0  # ρ = 1 at the first step: the clipped surrogate clips nothing
    assert "loss_mode: w_reinforce" in (out / "w-reinforce" / "seed0" / "config.yaml").read_text()

    report = plugin_dir / "report"
    runs.run([STARE_LAB, "analyze", str(out), "--out", str(report), "--metric", "loss/pos_token_frac"], cwd=plugin_dir)
    lines = (report / "report.md").read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if "`loss/pos_token_frac` (last logged)" in line)
    cols = [c.strip() for c in lines[head].strip("|").split("|")]
    row = next(line for line in lines[head:] if line.startswith("| w-reinforce"))
    cell = [c.strip() for c in row.strip("|").split("|")][cols.index("`loss/pos_token_frac` (last logged)")]
    assert float(cell) == pytest.approx(_rows(out / "w-reinforce" / "seed0")[-1]["loss/pos_token_frac"], abs=5e-4)
    assert not _changed(before), _changed(before)


def test_a_plugin_that_fails_is_one_line(plugin_dir):
    (plugin_dir / "broken.py").write_text("import no_such_module_here\n")
    proc = runs.run([STARE_LAB, "--plugin", "./broken.py", "simulate", "--preset", "collapse"], cwd=plugin_dir, rc=1)
    assert proc.stderr.strip() == ("stare-lab simulate: error: plugin './broken.py' failed to import: "
                                   "ModuleNotFoundError: No module named 'no_such_module_here'")


def test_an_installed_entry_point_loads_the_plugin_without_options(plugin_dir):
    """A package that declares ``[project.entry-points."stare_lab.plugins"]`` is what an installed distribution's
    ``.dist-info/entry_points.txt`` holds; with it on the path, ``--methods w-reinforce`` just works."""
    site = plugin_dir / "site"
    (site / "w_reinforce_pkg-1.0.dist-info").mkdir(parents=True)
    (site / "w_reinforce_pkg.py").write_text(example_code(), encoding="utf-8")
    (site / "w_reinforce_pkg-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: w-reinforce-pkg\nVersion: 1.0\n")
    (site / "w_reinforce_pkg-1.0.dist-info" / "entry_points.txt").write_text(
        "[stare_lab.plugins]\nw_reinforce = w_reinforce_pkg\n")
    out = plugin_dir / "ep"
    runs.run([STARE_LAB, "simulate", "--preset", "collapse", "--methods", "w-reinforce", "--seeds", "1", "--steps",
              "1", "--out", str(out), "--no-plots", *SMALL], cwd=plugin_dir, environ=runs.env(PYTHONPATH=str(site)))
    assert 0 < _rows(out / "w-reinforce" / "seed0")[0]["loss/pos_token_frac"] < 1


@pytest.mark.slow
@pytest.mark.trainer
def test_example_plugin_trains_one_step_of_the_tiny_model(plugin_dir, require, gsm8k_digits):
    require("deepspeed", "transformers", "math_verify")
    before = _project_files()
    out = plugin_dir / "train"
    runs.run([STARE_LAB, "train", "--preset", "tiny-cpu", "--train-data", str(gsm8k_digits), "--out", str(out),
              "method=w-reinforce", "plugins=[./w_reinforce.py]", f"loss.params.lam={LAM}",
              "schedule.total_steps=1", "rollout.engine=hf", "seed=3"], cwd=plugin_dir)
    (row,) = _rows(out)
    config = (out / "config.yaml").read_text()
    assert "method: w-reinforce" in config and "loss_mode: w_reinforce" in config and "w_reinforce.py" in config
    assert row["skipped"] == 0 and row["grad_norm"] > 0
    assert 0 < row["loss/pos_token_frac"] < 1  # the declared metric, averaged over the step's tokens
    assert row["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # on-policy first step
    assert "stare/num_pos_selected" not in row  # no STARE machinery for a loss that did not ask for it
    assert not _changed(before), _changed(before)
