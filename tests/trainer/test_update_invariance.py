"""The update is invariant to the micro-batch size, the number of ranks and the ZeRO stage (docs/theory.md §3:
normalisers are global over the optimizer step; DeepSpeed's rank-averaging of gradients is undone in
PolicyEngine.update; ω is selected over the whole step across the ranks by stare_lab.loss.step.prepare_step), and the
first-order prediction probes (trainer.step.prediction) leave the update unchanged (bit for bit; with the probe's
kept graph, to the rounding of the math attention kernel its forward uses).

Reference: the same fixed batch of 8 sequences updated in one process with one micro-batch per sequence under
ZeRO-3. Every other case must give the same parameters after one AdamW step (to float32 rounding, 1e-6): one
process packing everything into one or two micro-batches (ZeRO stage 0, the one-process default), two ranks under
ZeRO-3 and under ZeRO-2; with the probes on (ZeRO-3; ZeRO 0 in forward mode, ``method=jvp``), or with the
old-log-prob forward kept for the update (``optim.fuse_old_logprob``), the parameters are bit-identical to the same
case without them, and the predictions agree between ZeRO-3's partition-wise sums and ZeRO 0/2's full tensors —
which also checks the D terms of the probe's default one-micro-batch path (ZeRO 0: the ∇θH̄ backward recorded and
one backward through it), of forward mode (ZeRO 2 on two ranks, and ``method=jvp``) against the
one-gradient-per-term ones (ZeRO-3), and directly at ZeRO 0 with ``method=backward``. The probe of a step that is not taken (``schedule.probe_only``) leaves the parameters as they
were, bit for bit, and at this first step gives the same numbers as the step that is taken (P of a first Adam step on
the same gradient is the step's own P; with weight decay 0, ∇θH̄·(−P⊙g) is ∇θH̄·Δθ). STARE with the gate off updates
the parameters exactly as ``grpo`` does (bit for bit). (The probe of a step not taken is checked on ZeRO 0 and 3.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.trainer]
HELPER = Path(__file__).with_name("_update_invariance.py")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-5000:]


CASES = {  # name: (micro-batch token budget, processes, ZeRO stage, probes)
    "mb_small": (1, 1, 3, "0"),
    "mb_small_probe": (1, 1, 3, "1"),
    "mb_large_stage0": (4096, 1, 0, "0"),
    "mb_large_stage0_probe": (4096, 1, 0, "1"),
    "mb_large_zero3": (4096, 1, 3, "0"),
    "mb_large_zero3_fused": (4096, 1, 3, "fused"),
    "mb_large_stage0_fused": (4096, 1, 0, "fused"),
    "two_ranks_zero3": (16, 2, 3, "0"),
    "two_ranks_zero3_probe": (16, 2, 3, "1"),
    "two_ranks_zero2_probe": (16, 2, 2, "1"),
}
OTHER_LOSSES = {"gate_never": (4096, 1, 0, "never"), "grpo": (4096, 1, 0, "grpo"),
                "stage0_backward": (4096, 1, 0, "backward"), "stage0_jvp": (4096, 1, 0, "jvp"),
                "stage0_probe_only": (4096, 1, 0, "probe_only"),
                "zero3_probe_only": (4096, 1, 3, "probe_only")}


def test_update_independent_of_micro_batch_world_size_and_stage(require, tiny_model, tmp_path):
    require("deepspeed", "transformers")
    import torch

    outs = {}
    for name, (budget, procs, stage, probe) in {**CASES, **OTHER_LOSSES}.items():
        out = tmp_path / f"{name}.pt"
        launcher = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                         "--nproc_per_node", str(procs), "--master_port",
                                                         str(29700 + os.getpid() % 200)]
        _run(launcher + [str(HELPER), str(tiny_model), str(out), str(budget), str(stage), probe])
        outs[name] = torch.load(out)
    ref = outs["mb_small"]["params"]
    for name, res in ((n, outs[n]) for n in CASES):
        for k, v in ref.items():
            torch.testing.assert_close(res["params"][k], v, rtol=0, atol=1e-6, msg=f"{name}: {k}")
        assert res["selected"] == outs["mb_small"]["selected"] > 0  # the same L+ over 1 and 2 ranks
    for name, other in (("mb_small", "mb_small_probe"), ("mb_large_stage0", "stage0_jvp"),
                        ("mb_large_stage0", "mb_large_stage0_fused"), ("mb_large_zero3", "mb_large_zero3_fused"),
                        ("two_ranks_zero3", "two_ranks_zero3_probe")):
        # probes, or one forward for both passes: nothing changes, bit for bit
        other_params = outs[other]["params"]
        assert all(torch.equal(other_params[k], outs[name]["params"][k]) for k in other_params), (name, other)
    preds = [outs[n]["preds"] for n in ("mb_small_probe", "mb_large_stage0_probe", "two_ranks_zero2_probe",
                                        "two_ranks_zero3_probe")]  # partitions all-reduced = full tensors
    keys = {"pred_entropy_change", "pred/d_grpo", "pred/d_lplus", "pred/d_lminus", "pred/d_ratio", "pred/w_star"}
    assert set(preds[0]) == keys | {"pred/lplus_above_sstar"}
    assert preds[0]["pred/lplus_above_sstar"] is None  # ZeRO-3: no logits at θ_before on the gradient path
    graph, backward, probe_only = (outs[n]["preds"] for n in ("mb_large_stage0_probe", "stage0_backward",
                                                            "stage0_probe_only"))
    for other in preds[1:] + [backward, probe_only, outs["zero3_probe_only"]["preds"], outs["stage0_jvp"]["preds"]]:
        for k in keys:
            assert other[k] == pytest.approx(preds[0][k], rel=1e-4, abs=1e-10), k
    assert 0 <= graph["pred/lplus_above_sstar"] <= 1
    assert outs["stage0_jvp"]["preds"]["pred/lplus_above_sstar"] == pytest.approx(graph["pred/lplus_above_sstar"],
                                                                                   rel=1e-6)
    assert probe_only["pred/lplus_above_sstar"] == pytest.approx(graph["pred/lplus_above_sstar"], rel=1e-6)
    assert preds[2]["pred/lplus_above_sstar"] == pytest.approx(graph["pred/lplus_above_sstar"], rel=1e-6)  # 2 ranks
    assert preds[3]["pred/lplus_above_sstar"] is None
    # gate off ⇒ stare is grpo, bit for bit, through the trainer's update; and the gate-on step differs (ω acted)
    never, grpo = outs["gate_never"]["params"], outs["grpo"]["params"]
    assert all(torch.equal(never[k], grpo[k]) for k in never)
    assert any(not torch.equal(never[k], outs["mb_large_stage0"]["params"][k]) for k in never)
    from safetensors.torch import load_file

    init = load_file(str(tiny_model / "model.safetensors"))
    assert any((ref[k] - init[k]).abs().max() > 1e-4 for k in ref if k in init)  # the step did move the weights
    for name in ("stage0_probe_only", "zero3_probe_only"):
        unmoved = outs[name]["params"]
        assert all(torch.equal(unmoved[k], init[k].to(unmoved[k].dtype)) for k in unmoved if k in init), name  # the probe alone moves nothing
