"""STARE inside TRL (stare_lab.integrations.trl) on CPU with the tiny local model (trainer/tiny.py; nothing downloaded).

In-process: the config's validation, and the loss of one micro-batch against TRL's own ``GRPOTrainer.compute_loss``
(gate off: bit for bit, loss and gradients, for every supported ``loss_type``; gate on: the closed form of the
on-policy surrogate). Launched runs (``tests/integrations/_trl_run.py``, deterministic rollouts), all STARE C2 with
the gate on and the auto schedule: run A, 2 processes (torchrun, gloo), killed right after checkpoint 2; run B
resumes A to step 3; run C, 1 process with 2 micro-batches per step, 3 steps, uninterrupted; run D, 2 processes,
3 steps, uninterrupted (what B must equal bit for bit).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HELPER = Path(__file__).with_name("_trl_run.py")
sys.path.insert(0, str(HELPER.parent))
from _trl_common import GSM8K, REPO, _micro_batch, _require, assert_weights_equal_core  # noqa: E402


_require("trl", "transformers", "datasets", "accelerate")

from stare_lab.errors import ConfigError  # noqa: E402
from stare_lab.integrations import trl as stare_trl  # noqa: E402
from stare_lab.loss.stare import stare_token_weights  # noqa: E402


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRL_EXPERIMENTAL_SILENCE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, corpus_file=GSM8K)


def _config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=8,
                num_generations=4, max_completion_length=12)
    return stare_trl.STAREGRPOConfig(**{**base, **kw})


# --------------------------------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, message", [
    ({"reweight_w": 0.5}, "reweight_w=0.5 is outside [1, inf)"),
    ({"variant": "c3"}, "variant='C3' is not one of {'O1', 'C2'}"),
    ({"scope": "batch"}, "scope='batch' is not one of {'global', 'microbatch'}"),
    ({"top_p_ratio": 1.5}, "top_p_ratio=1.5 is outside [0, 1]"),
    ({"adaptive": True, "w_max": 1.05}, "w_max=1.05 is below reweight_w=1.1; need w_max >= reweight_w"),
    ({"loss_type": "sapo"}, "loss_type='sapo' is not one of {'grpo', 'bnpo', 'dr_grpo', 'dapo'}"),
    ({"top_entropy_quantile": 0.2}, "top_entropy_quantile=0.2 is not supported with STARE (allowed: 1)"),
    ({"entropy_coef": 0.01}, "entropy_coef=0.01 is not supported with STARE (allowed: 0)"),
    ({"beta": 0.04}, "use_bias_correction_kl=True with beta=0.04 is not supported"),
    ({"gradient_accumulation_steps": 2, "steps_per_generation": 3},
     "steps_per_generation=3 must be a multiple of gradient_accumulation_steps=2"),
])
def test_config_rejects_bad_values_in_one_line(tmp_path, kw, message):
    """Each bad value is one ConfigError line naming the key, the value and what is allowed."""
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, **kw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_config_maps_onto_the_core(tmp_path):
    """TRL's clip range and loss_type become the core's LossConfig (no dual clip: TRL has none, the core's c is
    1e9 > e^20); lower-case variant
    is normalised; the run directory defaults to <output_dir>/stare_run."""
    cfg = _config(tmp_path, variant="c2", epsilon=0.2, epsilon_high=0.28, loss_type="grpo", beta=0.01,
                  use_bias_correction_kl=False)
    loss = cfg.loss_config()
    assert (cfg.variant, loss.loss_mode, loss.stare.variant) == ("C2", "stare", "C2")
    assert (loss.clip_ratio_low, loss.clip_ratio_high, loss.clip_ratio_c) == (0.2, 0.28, stare_trl.NO_DUAL_CLIP)
    assert (loss.loss_agg_mode, loss.kl_coef, loss.kl_estimator) == ("seq-mean-token-mean", 0.01, "k3")
    assert cfg.run_dir() == os.path.join(str(tmp_path), "stare_run")
    assert _config(tmp_path, loss_type="dr_grpo").loss_config().loss_agg_mode == "token-mean"
    assert _config(tmp_path, stare_run_dir="").run_dir() is None


def test_import_stare_lab_does_not_import_trl():
    """``import stare_lab`` (and its integrations package) must not load TRL."""
    code = "import sys, stare_lab, stare_lab.integrations; print('trl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------------------------
# one micro-batch, in process: STARE vs TRL's own loss
# --------------------------------------------------------------------------------------------------------------


def _trainer(cls, cfg, model_dir):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = Dataset.from_list([{"prompt": f"prompt {i}"} for i in range(8)])
    trainer = cls(model=model, processing_class=tok, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                  args=cfg, train_dataset=ds)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = cfg.gradient_accumulation_steps
    return trainer


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_gate_off_is_trl_loss_bit_for_bit(tmp_path, tiny_model, loss_type):
    """Gate off (target_entropy=0: H̄ < 0 never holds) ⇒ the loss of one micro-batch and its gradient are exactly
    TRL's own ``GRPOTrainer.compute_loss`` of the same ``loss_type`` (torch.equal, 2 micro-batches per step, so
    the gradient-accumulation scaling is exercised too)."""
    from trl import GRPOConfig, GRPOTrainer

    kw = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=8,
              num_generations=4, max_completion_length=12, loss_type=loss_type, gradient_accumulation_steps=2,
              epsilon=0.2, epsilon_high=0.28)
    plain = _trainer(GRPOTrainer, GRPOConfig(**kw), tiny_model)
    stare = _trainer(stare_trl.STAREGRPOTrainer, stare_trl.STAREGRPOConfig(**kw, target_entropy=0.0, variant="C2"),
                     tiny_model)
    batch = _micro_batch(len(plain.processing_class))
    expected = plain.compute_loss(plain.model, dict(batch))
    inputs = dict(batch)
    stare._stare_open_step([inputs])  # what compute_loss does when a step opens (one micro-batch here)
    got = stare.compute_loss(stare.model, inputs)
    assert not stare.stare_step.gate_on
    assert torch.equal(got, expected)
    expected.backward()
    got.backward()
    for (name, p), q in zip(plain.model.named_parameters(), stare.model.parameters()):
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_gate_on_is_the_weighted_surrogate(tmp_path, tiny_model, micro_batches):
    """Gate on, on-policy (ρ = 1): TRL's clipped surrogate is −Â per token, so the ``dapo`` loss of a micro-batch is
    Σ ω·(−Â)·m / (num_items_in_batch · GA / steps_per_generation) with ω the core's ``stare_token_weights`` of the
    whole step (C2, P = 0.25, W = 1.5, M = 0.5). The surprisal and the entropies the step used are those of the
    model's logits, computed here directly (log_softmax; H = −Σ p log p); s* lies in [0, H]. With 2 micro-batches
    the second is measured by the no-grad forward when the step opens, the first by its loss forward."""
    cfg = _config(tmp_path, loss_type="dapo", target_entropy=100.0, variant="C2", top_p_ratio=0.25, reweight_w=1.5,
                  reweight_m=0.5, gradient_accumulation_steps=micro_batches)
    stare = _trainer(stare_trl.STAREGRPOTrainer, cfg, tiny_model)
    full = _micro_batch(len(stare.processing_class))
    rows = 8 // micro_batches
    micro = [{k: (v[i * rows:(i + 1) * rows] if v.dim() else v) for k, v in full.items()} for i in range(micro_batches)]
    stare._stare_open_step(micro)
    loss = stare.compute_loss(stare.model, micro[0])
    prep = stare.stare_step
    mask = full["completion_mask"].bool()
    with torch.no_grad():
        ids = torch.cat([full["prompt_ids"], full["completion_ids"]], 1)
        logits = stare.model(input_ids=ids, attention_mask=torch.cat([full["prompt_mask"], full["completion_mask"]], 1),
                             ).logits[:, -13:-1]
        logp_all = torch.log_softmax(logits.float(), -1)
        logp = logp_all.gather(-1, full["completion_ids"][..., None])[..., 0]
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    assert torch.allclose(torch.where(prep.batch.response_mask, prep.batch.old_logprobs, 0.0), logp * mask, atol=1e-5)
    assert abs(prep.entropy - (entropy * mask).sum().item() / mask.sum().item()) < 1e-5
    sstar = torch.cat([mb["stare_sstar"] for mb in micro])
    assert bool(((sstar >= 0) & (sstar <= entropy + 1e-4))[mask].all()) and bool((sstar[mask] > 0).all())
    omega, stats = stare_token_weights(prep.batch.old_logprobs, full["advantages"], mask, cfg.loss_config().stare,
                                       reweight_w=1.5, reweight_m=0.5)
    assert prep.gate_on and torch.equal(prep.token_weights, omega)
    assert int(stats["stare/num_pos_selected"]) == math.ceil(0.25 * 27)  # T+: rows with Â > 0 hold 3+5+9+10 tokens
    m0 = mask[:rows]
    expected = (omega[:rows] * -full["advantages"][:rows, None] * m0).sum() / full["num_items_in_batch"].float()
    assert torch.allclose(loss, expected, rtol=1e-6, atol=1e-7)


def test_microbatch_scope_selects_per_loss_call(tmp_path, tiny_model):
    """Scope ``microbatch`` (the reference's): each loss call selects L± over its own micro-batch, so the ``bnpo``
    loss of micro-batch i is Σ ω_i·(−Â)·m / n_i / GA with ω_i the core's weights of that micro-batch alone, and the
    step's logged |L+| is the sum of the per-micro-batch k = ⌈P·|T+_i|⌉; the gate is still the step's."""
    cfg = _config(tmp_path, loss_type="bnpo", target_entropy=100.0, variant="C2", top_p_ratio=0.25, reweight_w=1.5,
                  reweight_m=0.5, scope="microbatch", gradient_accumulation_steps=2)
    stare = _trainer(stare_trl.STAREGRPOTrainer, cfg, tiny_model)
    full = _micro_batch(len(stare.processing_class))
    micro = [{k: (v[i * 4:(i + 1) * 4] if v.dim() else v) for k, v in full.items()} for i in range(2)]
    stare._stare_open_step(micro)
    expected_k = 0
    for i, mb in enumerate(micro):
        loss = stare.compute_loss(stare.model, mb)  # the second call closes the step
        mask = mb["completion_mask"].bool()
        lp = stare.stare_step.batch.old_logprobs[i * 4:(i + 1) * 4]
        omega, stats = stare_token_weights(lp, mb["advantages"], mask, cfg.loss_config().stare, reweight_w=1.5,
                                           reweight_m=0.5)
        expected_k += int(stats["stare/num_pos_selected"])
        expected = (omega * -mb["advantages"][:, None] * mask).sum() / mask.sum() / 2
        assert torch.allclose(loss, expected, rtol=1e-6, atol=1e-7), i
    assert stare.stare_step.token_weights is None and stare.stare_step.gate_on
    assert stare._stare_logs["train"]["stare/num_pos_selected"] == [expected_k]
    assert expected_k == math.ceil(0.25 * 8) + math.ceil(0.25 * 19)  # T+ of the two halves: 3+5 and 9+10 tokens


# --------------------------------------------------------------------------------------------------------------
# the cost of the auto schedule: no extra pass
# --------------------------------------------------------------------------------------------------------------


def _passes_per_step(tmp_path, model_dir, **stare) -> tuple[list[tuple[int, int]], list[float]]:
    """(forwards, backwards) of the model in each optimizer step of a 3-step in-process STAREGRPOTrainer run (the
    deterministic rollout of ``_trl_run.py``, 2 micro-batches per step), counted by a forward hook on the model
    module and a gradient-accumulation hook on its first parameter, and the W of each step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from _trl_run import NUM_GENERATIONS, reward, rollout

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    counts, per_step, ws = [0, 0], [], []
    model.register_forward_hook(lambda *a: counts.__setitem__(0, counts[0] + 1))
    # a backward pass accumulates into every parameter once: count it at the first one (the module's full backward
    # hook does not fire on a model whose output is a ModelOutput)
    next(model.parameters()).register_post_accumulate_grad_hook(lambda p: counts.__setitem__(1, counts[1] + 1))

    class PerStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            per_step.append((counts[0], counts[1]))
            counts[:] = [0, 0]
            ws.append(trainer.stare_controller.reweight_w)

    cfg = stare_trl.STAREGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4,
        gradient_accumulation_steps=2, num_generations=NUM_GENERATIONS, max_completion_length=10,
        learning_rate=1e-3, loss_type="dapo", beta=0.0, max_steps=3, logging_steps=1, save_strategy="no", seed=0,
        shuffle_dataset=False, variant="C2", top_p_ratio=0.2, target_entropy=100.0, stare_run_dir="",
        quadrant_every=0, **stare)
    trainer = stare_trl.STAREGRPOTrainer(
        model=model, processing_class=tok, reward_funcs=reward, args=cfg,
        train_dataset=Dataset.from_list([{"prompt": f"prompt {i}"} for i in range(16)]),
        rollout_func=rollout(10, len(tok), tok.eos_token_id), callbacks=[PerStep()])
    trainer.train()
    return per_step, ws


def test_auto_schedule_adds_no_forward_or_backward_pass(tmp_path, tiny_model):
    """The auto schedule reads only H̄, which the step measures anyway: over 3 optimizer steps (2 micro-batches each,
    the gate on: H_tgt = 100 nats) the model runs exactly as many forward and backward passes per step with
    ``schedule=auto`` as with the same W fixed (hooks on the model module): one backward per micro-batch, at least
    as many forwards; and the auto run's W does move (the schedule ran)."""
    fixed, w_fixed = _passes_per_step(tmp_path / "fixed", tiny_model, reweight_w=2.0, reweight_m=0.5)
    auto, w_auto = _passes_per_step(tmp_path / "auto", tiny_model, adaptive=True, schedule="auto")
    assert len(fixed) == 3 and fixed == auto, (fixed, auto)
    assert all(b == 2 and f >= 2 for f, b in fixed)  # one backward per micro-batch
    assert w_fixed == [2.0] * 3 and w_auto[0] < w_auto[-1]


# --------------------------------------------------------------------------------------------------------------
# launched runs
# --------------------------------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(model: Path, out: Path, nproc: int, *extra: str) -> subprocess.CompletedProcess:
    base = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                                                str(nproc), "--master_port", str(_free_port())]
    cmd = [*base, str(HELPER), "--model", str(model), "--out", str(out), "--dump", *extra]
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory) -> dict[str, Path]:
    """A: 2 processes, killed after checkpoint 2; B: A resumed to step 3; C: 1 process, 2 micro-batches per step;
    D: 2 processes, uninterrupted. All with the auto schedule (H_tgt = 100 nats: H̄ below it from step 1 on, so the
    checkpoint of step 2 holds a controller mid-acquisition)."""
    root = tmp_path_factory.mktemp("trl_runs")
    a, c, d = root / "two_proc", root / "one_proc", root / "two_proc_whole"
    auto = ("--schedule", "auto")
    killed = _launch(tiny_model, a, 2, "--steps", "3", "--kill-after", "2", *auto)
    assert killed.returncode != 0 and "exitcode  : 17" in killed.stderr, killed.stderr[-3000:]
    resumed = _launch(tiny_model, a, 2, "--steps", "3", "--resume", str(a / "checkpoint-2"), *auto)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    single = _launch(tiny_model, c, 1, "--steps", "3", "--ga", "2", *auto)
    assert single.returncode == 0, single.stderr[-3000:]
    whole = _launch(tiny_model, d, 2, "--steps", "3", *auto)
    assert whole.returncode == 0, whole.stderr[-3000:]
    return {"two": a, "one": c, "whole": d, "model": tiny_model}


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "stare_run" / "metrics.jsonl").read_text().splitlines()]


def _replayed(rows: list[dict]) -> list[tuple]:
    """(gate, W, M) of a fresh controller with the run's STARE settings fed each row's H̄ once, in step order: what
    a run that updates its controller once per optimizer step, with that H̄, logs."""
    from stare_lab.config import STAREConfig
    from stare_lab.loss.controller import STAREController

    ctl = STAREController(STAREConfig(variant="C2", target_entropy=100.0, adaptive=True, schedule="auto"))
    return [(int(ctl.update(r["entropy"])), ctl.reweight_w, ctl.reweight_m) for r in rows]


def _rows(paths: list[Path]) -> tuple[dict, list[dict]]:
    """Row identity → (ω, log-prob) of its valid tokens, over the dumps of one step; and the dumps."""
    dumps = [torch.load(p, weights_only=False) for p in paths]
    out = {}
    for d in dumps:
        for i, row in enumerate(d["rows"]):
            m = d["mask"][i]
            out[row] = (d["weights"][i][m], d["logprobs"][i][m])
    return out, dumps


@pytest.mark.slow
def test_two_processes_three_steps_c2_gate_on(runs):
    """The killed-and-resumed 2-process run has one metrics row per step 1…3, both processes' 16 rows in every step,
    the gate on (H_tgt = 100 nats > log V) and the auto schedule acquiring: W raised at step 2 (H̄ below H_tgt and
    falling: the checkpoint of the resume test holds a W that moved), never lowered, M = 1/W; gate, W and M those
    of a fresh controller fed each step's logged H̄ once (1 process with 2 micro-batches per step too: the
    controller moves once per optimizer step, not per micro-batch); TRL's own log history carries the same STARE
    keys."""
    rows = _metrics(runs["two"])
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["gate_on"] for r in rows] == [1, 1, 1] and {r["num_sequences"] for r in rows} == {16}
    ws = [r["stare_w"] for r in rows]
    assert ws[0] < ws[1] <= ws[2] and all(r["stare_m"] == 1.0 / r["stare_w"] for r in rows)
    assert [(r["gate_on"], r["stare_w"], r["stare_m"]) for r in rows] == _replayed(rows)
    one = _metrics(runs["one"])
    assert [(r["gate_on"], r["stare_w"], r["stare_m"]) for r in one] == _replayed(one)
    assert all(r["stare/num_pos_selected"] > 0 and r["stare/num_neg_selected"] > 0 for r in rows)
    state = json.loads((runs["two"] / "trainer_state.json").read_text())
    logged = [e for e in state["log_history"] if "stare/w" in e]  # steps 1-2 come back from checkpoint 2
    assert [e["step"] for e in logged] == [1, 2, 3] and [e["stare/gate_on"] for e in logged] == [1.0] * 3
    assert [e["stare/w"] for e in logged] == pytest.approx(ws, rel=1e-6)
    assert {f"quadrant/{q}/share" for q in ("pos_high", "pos_low", "neg_high", "neg_low")} <= set(logged[0])


@pytest.mark.slow
def test_weights_equal_core_on_gathered_batch(runs):
    """ω of every step of the 2-process run equals the core's ``stare_token_weights`` on the batch gathered from
    both processes (rank 0's rows, then rank 1's), token for token."""
    for step in (1, 2, 3):
        assert_weights_equal_core(runs["two"] / "dump", step, ranks=2)


@pytest.mark.slow
def test_one_and_two_processes_agree(runs):
    """The same step batch on 1 process (2 micro-batches) and on 2 processes: the same rows, bit-identical
    log-probs and ω, the same decision; the parameters after the step agree to float tolerance (SGD, lr 0.05:
    the step moves them by ~4e-3)."""
    from safetensors.torch import load_file

    two, _ = _rows([runs["two"] / "dump" / f"step1_rank{r}.pt" for r in (0, 1)])
    one, dumps = _rows([runs["one"] / "dump" / "step1_rank0.pt"])
    assert set(two) == set(one) and len(one) == 16
    for row in one:
        assert torch.equal(one[row][0], two[row][0]) and torch.equal(one[row][1], two[row][1])
    d2 = torch.load(runs["two"] / "dump" / "step1_rank1.pt", weights_only=False)
    assert (dumps[0]["gate_on"], dumps[0]["w"], dumps[0]["m"]) == (d2["gate_on"], d2["w"], d2["m"])
    p1 = load_file(runs["one"] / "checkpoint-1" / "model.safetensors")
    p2 = load_file(runs["two"] / "checkpoint-1" / "model.safetensors")
    p0 = load_file(runs["model"] / "model.safetensors")
    assert max((p1[k] - p0[k]).abs().max().item() for k in p1) > 1e-3
    assert max((p1[k] - p2[k]).abs().max().item() for k in p1) < 1e-6


@pytest.mark.slow
def test_kill_and_resume_restores_the_controller(runs):
    """The resumed processes load exactly the state saved at checkpoint 2 — the auto schedule mid-acquisition: past
    the crossing (step 1), W moved, not yet in its hold — and the resumed run equals the uninterrupted 2-process run
    bit for bit: every metrics row (all but wall time), the controller after step 3 and the parameters of checkpoint
    3. Against the uninterrupted 1-process run the controller agrees field for field but H̄ (to 1e-6: one process
    sums the batch's entropy in another order)."""
    from safetensors.torch import load_file

    saved = json.loads((runs["two"] / "checkpoint-2" / stare_trl.CONTROLLER_FILE).read_text())
    ctl = saved["controller"]
    assert saved["global_step"] == 2 and ctl["num_updates"] == 2
    assert ctl["crossed_at"] == 1 and ctl["auto_hold_steps"] == 0 and ctl["auto_x"] is not None
    first = _metrics(runs["whole"])[0]
    assert first["gate_on"] == 1 and ctl["gate_on"] is True and ctl["reweight_w"] != first["stare_w"]
    for r in (0, 1):
        assert json.loads((runs["two"] / f"resumed_controller_rank{r}.json").read_text()) == saved["controller"]
    resumed, whole = _metrics(runs["two"]), _metrics(runs["whole"])
    assert [r["step"] for r in resumed] == [r["step"] for r in whole] == [1, 2, 3]
    stable = lambda r: {k: v for k, v in r.items() if not k.startswith("time/")}  # noqa: E731
    assert [stable(r) for r in resumed] == [stable(r) for r in whole]
    after = json.loads((runs["two"] / "checkpoint-3" / stare_trl.CONTROLLER_FILE).read_text())["controller"]
    assert after == json.loads((runs["whole"] / "checkpoint-3" / stare_trl.CONTROLLER_FILE).read_text())["controller"]
    p_res, p_whole = (load_file(runs[k] / "checkpoint-3" / "model.safetensors") for k in ("two", "whole"))
    assert p_res.keys() == p_whole.keys() and all(torch.equal(p_res[k], p_whole[k]) for k in p_res)
    reference = json.loads((runs["one"] / "checkpoint-3" / stare_trl.CONTROLLER_FILE).read_text())["controller"]
    assert after["num_updates"] == 3
    assert {k: v for k, v in after.items() if k != "last_entropy"} == {
        k: v for k, v in reference.items() if k != "last_entropy"}
    assert abs(after["last_entropy"] - reference["last_entropy"]) < 1e-6


@pytest.mark.slow
def test_analyze_reads_the_trl_run(runs, tmp_path):
    """``stare-lab analyze`` on the 2-process run's output folder reads its stare_run/ (method c2, 3 steps, the gate
    and W of the metrics rows), and on a copy of the folder's trainer_state.json alone reads TRL's log history: one
    report with figures and a verdict naming both."""
    from analysis.analyze import analyze
    from analysis.load import load_runs

    plain = tmp_path / "trl_log_only"
    plain.mkdir()
    (plain / "trainer_state.json").write_text((runs["two"] / "trainer_state.json").read_text())
    loaded = {r.path.name: r for r in load_runs([runs["two"], plain])}
    assert set(loaded) == {"stare_run", "trl_log_only"}
    for run in loaded.values():
        assert run.steps.tolist() == [1, 2, 3]
        assert run.column("gate_on").tolist() == [1.0, 1.0, 1.0]
        assert run.column("stare_w").tolist() == pytest.approx([r["stare_w"] for r in _metrics(runs["two"])],
                                                                rel=1e-6)
    result = analyze([runs["two"], plain], tmp_path / "report")
    assert "c2" in result.verdict and "trl_log_only" in result.verdict
    written = {p.name for p in (tmp_path / "report").iterdir()}
    assert {"dynamics.png", "quadrants.png", "report.md", "report.html"} <= written
