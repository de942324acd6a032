"""The step preparation on 2 torch.distributed processes (gloo) equals one process over the concatenated batch.

ω, counts, H̄, the gate and the global statistics must be bit-identical (integers and fixed-point sums; the
selection by reduced radix histograms), for O1 and C2, per-row and per-token advantages, with and without ties;
the summed loss and gradient of a parameter shared by the ranks equal the one-process ones to float32 rounding.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HELPER = Path(__file__).with_name("_step_gloo.py")
sys.path.insert(0, str(HELPER.parent))
import _step_gloo  # noqa: E402
from _ranks import concat_batches  # noqa: E402


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gloo") / "res"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(29500 + os.getpid() % 400), str(HELPER), str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-5000:]
    return [torch.load(f"{out}.rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("name", list(_step_gloo.cases()))
def test_two_gloo_ranks_equal_one_process(rank_results, name):
    from stare_lab.loss.stare import STAREController
    from stare_lab.loss.step import prepare_step

    cfg, parts = _step_gloo.cases()[name]
    whole = concat_batches(parts)
    ref = prepare_step(whole, cfg, controller=STAREController(cfg.stare), step=2, seed=9)
    ref_loss, ref_grad = _step_gloo.loss_and_grad(ref, cfg)
    got = [r[name] for r in rank_results]
    for g in got:
        assert g["metrics"] == ref.metrics()
        assert g["global_stats"].keys() == {k for k in ref.global_stats if k != "generator"}
        for k, v in g["global_stats"].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(ref.global_stats[k])), k
    if ref.token_weights is None:
        assert all(g["token_weights"] is None for g in got)
    else:
        width = whole.shape[1]
        w = torch.cat([torch.nn.functional.pad(g["token_weights"], (0, width - g["token_weights"].shape[1]),
                                               value=1.0) for g in got])
        assert torch.equal(w, ref.token_weights)
        assert (w != 1).any()  # the selection did select
    loss, grad = got[0]["loss_grad"]
    assert loss == pytest.approx(ref_loss, abs=1e-6) and grad == pytest.approx(ref_grad, abs=1e-6)
    assert got[1]["loss_grad"] == got[0]["loss_grad"]
