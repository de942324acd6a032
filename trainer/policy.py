"""The policy engine: a DeepSpeed-wrapped Hugging Face causal LM with the trainer's three jobs —
per-token log-probs and entropies (the core's chunked, temperature-scaled functions), the update with global
normalisers, and a bucketed parameter iterator for the weight sync.

Micro-batches are padded blocks of whole sequences packed greedily by a token budget
(``rows × longest sequence ≤ optim.micro_batch_max_tokens``). Because ZeRO-3 gathers parameters with collectives in
every forward, all ranks run the same number of forwards/backwards per phase: a rank with fewer micro-batches runs
dummy ones whose loss is ``0 · Σ logits`` (zero gradient, every parameter touched so the gradient hooks match).

Loss normalisation (docs/theory.md §3): each micro-batch loss is ``compute_policy_loss(...)`` with
``global_num_tokens``/``global_num_sequences`` counted over the whole optimizer step (all micro-batches, all
ranks), so summing the micro-batch gradients gives the gradient of the full-batch loss; DeepSpeed then *averages*
gradients over the data-parallel ranks, which we undo by multiplying each loss by the world size. The update is
therefore independent of the micro-batch size and of the number of ranks (tested in tests/trainer).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from stare_lab.entropy import entropy_from_logits, logprobs_from_logits

logger = logging.getLogger(__name__)

__all__ = ["TrainBatch", "PolicyEngine", "pack_micro_batches", "pad_2d"]


@dataclasses.dataclass
class TrainBatch:
    """One rank's share of the step's training sequences (python lists; tensors are built per micro-batch).

    Attributes:
        prompt_ids: ``[B][Lp_i]`` prompt tokens.
        response_ids: ``[B][T_i]`` response tokens (eos included when the response stopped on it).
        response_mask: ``[B][T_i]`` 1.0 for tokens in the loss (0 for a masked overlong response).
        advantages: ``[B]`` per-sequence advantages.
        rollout_logprobs: ``[B][T_i]`` engine log-probs (for TIS), or ``None``.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_mask: list[list[float]]
    advantages: list[float]
    rollout_logprobs: list[list[float]] | None = None

    def __len__(self) -> int:
        return len(self.response_ids)


def pack_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Greedy packing of sequence indices (in order of decreasing length) into micro-batches whose padded size
    ``rows × max length`` stays within ``max_tokens`` (a single longer sequence gets its own micro-batch).

    Returns a list of index lists covering ``range(len(lengths))`` exactly once.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        out.append(cur)
    return out


def pad_2d(rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
    """Right-pad ragged rows into a ``[len(rows), width]`` tensor."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.full((len(rows), max(width, 1)), value, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.as_tensor(list(r), dtype=dtype)
    return out


class PolicyEngine:
    """DeepSpeed engine around ``AutoModelForCausalLM`` (ZeRO 0–3, bf16/fp16/fp32, optional offload and gradient
    checkpointing), with a client torch AdamW (or DeepSpeed's) and an LR schedule.

    Args:
        cfg: a :class:`trainer.config.TrainerConfig`.
        model_dir: the HF model directory to start from.
        dist: a :class:`trainer.launch.DistInfo`.
    """

    def __init__(self, cfg: Any, model_dir: str | Path, dist: Any) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM
        from transformers.integrations import HfDeepSpeedConfig

        from .launch import deepspeed_json

        self.cfg = cfg
        self.dist = dist
        self.ds_config = deepspeed_json(cfg, dist.world_size)
        self.zero3 = self.ds_config.get("zero_optimization", {}).get("stage", 0) == 3
        # alive only while loading: ZeRO-3 partitioned construction (zero.Init) inside from_pretrained; dropped
        # afterwards so that other models loaded in this process (e.g. the HF rollout engine) are not partitioned
        hf_ds = HfDeepSpeedConfig(self.ds_config) if self.zero3 else None
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch.float32, attn_implementation=cfg.model.attn_implementation
        )
        del hf_ds
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        o = cfg.optim
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = None
        if o.optimizer == "torch_adamw":
            optimizer = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                          weight_decay=o.weight_decay)
        else:
            self.ds_config["optimizer"] = {
                "type": "AdamW",
                "params": {"lr": o.lr, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay},
            }
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=params, optimizer=optimizer, config=self.ds_config,
            lr_scheduler=(lambda opt: _lr_scheduler(opt, cfg)),
        )
        self.device = self.engine.device
        self.temperature = cfg.rollout.temperature
        self.max_tokens = o.micro_batch_max_tokens

    # ------------------------------------------------------------------------------------------------------------
    # collectives
    # ------------------------------------------------------------------------------------------------------------

    def all_reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """All-reduce a few float64 scalars over all ranks (``sum`` or ``max``); identity on one rank."""
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64, device=self._comm_device())
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.tolist()

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (in rank order)."""
        import torch.distributed as dist

        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return [obj]
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    def _comm_device(self) -> torch.device:
        return torch.device(self.device) if torch.cuda.is_available() else torch.device("cpu")

    # ------------------------------------------------------------------------------------------------------------
    # forward
    # ------------------------------------------------------------------------------------------------------------

    def _micro_plan(self, batch: TrainBatch) -> list[list[int]]:
        lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)]
        plan = pack_micro_batches(lengths, self.max_tokens)
        n_max = int(self.all_reduce([len(plan)], op="max")[0])
        return plan + [[] for _ in range(n_max - len(plan))]  # [] = dummy micro-batch

    def _forward(self, batch: TrainBatch, idx: list[int], *, need_entropy: bool, entropy_grad: bool):
        """Forward on one micro-batch. Returns ``(logits_sum_for_dummy, logprobs [b,T], entropy [b,T] | None,
        mask [b,T])``; for a dummy micro-batch (``idx == []``) only the first is set."""
        if not idx:
            ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
            out = self.engine(input_ids=ids, attention_mask=torch.ones_like(ids))
            return out.logits.float().sum(), None, None, None
        seqs = [batch.prompt_ids[i] + batch.response_ids[i] for i in idx]
        input_ids = pad_2d(seqs, 0, torch.long).to(self.device)
        attn = pad_2d([[1] * len(s) for s in seqs], 0, torch.long).to(self.device)
        logits = self.engine(input_ids=input_ids, attention_mask=attn).logits  # [b, L, V]
        t_max = max(len(batch.response_ids[i]) for i in idx)
        # position of the logit that predicts response token j of row r: len(prompt_r) - 1 + j
        pos = torch.zeros((len(idx), t_max), dtype=torch.long)
        for r, i in enumerate(idx):
            lp = len(batch.prompt_ids[i])
            n = len(batch.response_ids[i])
            pos[r, :n] = torch.arange(lp - 1, lp - 1 + n)
            pos[r, n:] = lp - 1
        pos = pos.to(self.device)
        resp_logits = torch.gather(logits, 1, pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        tokens = pad_2d([batch.response_ids[i] for i in idx], 0, torch.long, t_max).to(self.device)
        mask = pad_2d([batch.response_mask[i] for i in idx], 0.0, torch.float32, t_max).to(self.device)
        logprobs = logprobs_from_logits(resp_logits, tokens, self.temperature)
        entropy = None
        if need_entropy:
            src = resp_logits if entropy_grad else resp_logits.detach()
            entropy = entropy_from_logits(src, self.temperature)
        return None, logprobs, entropy, mask

    @torch.no_grad()
    def compute_logprobs(self, batch: TrainBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-sequence log-probs and entropies (nats) of the response tokens under the current policy at the
        rollout temperature: two lists of ``[T_i]`` float32 CPU tensors. Collective: every rank must call it."""
        self.engine.eval()
        lps: list[torch.Tensor | None] = [None] * len(batch)
        ents: list[torch.Tensor | None] = [None] * len(batch)
        for idx in self._micro_plan(batch):
            _, lp, ent, _ = self._forward(batch, idx, need_entropy=True, entropy_grad=False)
            for r, i in enumerate(idx):
                n = len(batch.response_ids[i])
                lps[i] = lp[r, :n].float().cpu()
                ents[i] = ent[r, :n].float().cpu()
        return lps, ents  # type: ignore[return-value]

    # ------------------------------------------------------------------------------------------------------------
    # update
    # ------------------------------------------------------------------------------------------------------------

    def update(
        self,
        batch: TrainBatch,
        *,
        old_logprobs: Sequence[torch.Tensor],
        old_entropy: Sequence[torch.Tensor],
        token_weights: Sequence[torch.Tensor] | None,
        loss_config: Any,
        global_num_tokens: float,
        global_num_sequences: float,
        loss_extras: dict[str, Any] | None = None,
    ) -> dict[str, float]:
        """One optimizer step over ``batch`` (collective).

        Args:
            old_logprobs, old_entropy: per-sequence ``[T_i]`` tensors from :meth:`compute_logprobs`.
            token_weights: per-sequence STARE ω ``[T_i]`` (computed once per step over the global batch), or None.
            loss_config: :class:`stare_lab.config.LossConfig`; ``loss_mode`` picks the registry loss.
            global_num_tokens, global_num_sequences: loss-mask token / sequence counts over all ranks.
            loss_extras: extra :class:`~stare_lab.losses.PolicyLossInputs` fields (e.g. gate state for
                ``stare.scope=microbatch``, a generator for Clip-Cov).

        Returns:
            token-weighted means of the loss metrics over all ranks (``loss/...``), ``loss/total`` and
            ``grad_norm``.
        """
        from stare_lab.losses import PolicyLossInputs, compute_policy_loss

        self.engine.train()
        world = self.dist.world_size
        need_grad_entropy = loss_config.entropy_coeff > 0
        sums: dict[str, float] = {}
        loss_total = 0.0
        n_local_tok = 0.0
        for idx in self._micro_plan(batch):
            dummy, lp, ent, mask = self._forward(batch, idx, need_entropy=need_grad_entropy,
                                                 entropy_grad=need_grad_entropy)
            if dummy is not None:
                self.engine.backward(dummy * 0.0, scale_wrt_gas=False)
                continue
            t_max = lp.shape[1]
            rows = lambda seq: pad_2d([seq[i].tolist() for i in idx], 0.0, torch.float32, t_max).to(self.device)  # noqa: E731
            kwargs: dict[str, Any] = dict(
                logprobs=lp,
                old_logprobs=rows(old_logprobs),
                advantages=torch.tensor([batch.advantages[i] for i in idx], dtype=torch.float32, device=self.device),
                response_mask=mask,
                entropy=ent if need_grad_entropy else rows(old_entropy),
                token_weights=rows(token_weights) if token_weights is not None else None,
                global_num_tokens=global_num_tokens,
                global_num_sequences=global_num_sequences,
            )
            if batch.rollout_logprobs is not None:
                kwargs["rollout_logprobs"] = pad_2d(
                    [batch.rollout_logprobs[i] for i in idx], 0.0, torch.float32, t_max).to(self.device)
            kwargs.update(loss_extras or {})
            loss, metrics = compute_policy_loss(loss_config.loss_mode, PolicyLossInputs(**kwargs), loss_config)
            # DeepSpeed averages gradients over ranks; × world size makes the sum over ranks of Σ_tokens / N_global
            self.engine.backward(loss * world, scale_wrt_gas=False)
            ntok = float(mask.sum())
            n_local_tok += ntok
            loss_total += float(loss.detach())
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    sums[k] = sums.get(k, 0.0) + float(v) * ntok
        self.engine.step()
        keys = sorted(set().union(*self.all_gather_object(sorted(sums))))
        red = self.all_reduce([sums.get(k, 0.0) for k in keys] + [n_local_tok, loss_total])
        n_tok = max(red[-2], 1.0)
        out = {(k if k.startswith("loss/") else f"loss/{k}"): v / n_tok for k, v in zip(keys, red[:-2])}
        out["loss/total"] = red[-1]
        gn = self.engine.get_global_grad_norm()
        out["grad_norm"] = float(gn) if gn is not None else None
        out["lr"] = float(self.engine.get_lr()[0])
        return out

    # ------------------------------------------------------------------------------------------------------------
    # parameters for the sync / export
    # ------------------------------------------------------------------------------------------------------------

    def iter_named_params(self, bucket_bytes: float, materialize: bool = True
                          ) -> Iterator[tuple[str, torch.Tensor | None]]:
        """Yield ``(name, full tensor)`` for every parameter (HF names), gathering ZeRO-3 partitions bucket by
        bucket (``deepspeed.zero.GatheredParameters``, ≤ ``bucket_bytes`` per gather, or one parameter if it is
        larger). Collective under ZeRO-3: every rank must consume the whole iterator in the same order. Yielded
        tensors are detached copies (on the parameters' device, in their dtype); with ``materialize=False`` no copy
        is made and ``None`` is yielded in place of each tensor (a rank that only takes part in the gathers, e.g.
        every rank but 0 in :meth:`save_hf`)."""
        import deepspeed

        bucket: list[tuple[str, torch.nn.Parameter]] = []
        size = 0

        def flush():
            params = [p for _, p in bucket]
            if self.zero3:
                with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                    out = [(n, p.data.detach().clone() if materialize else None) for n, p in bucket]
            else:
                out = [(n, p.data.detach().clone() if materialize else None) for n, p in bucket]
            return out

        for name, p in self.engine.module.named_parameters():
            numel = getattr(p, "ds_numel", p.numel())
            bucket.append((name, p))
            size += numel * p.element_size()
            if size >= bucket_bytes:
                yield from flush()
                bucket, size = [], 0
        if bucket:
            yield from flush()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """All parameters as full CPU tensors, on every rank (collective under ZeRO-3; tests only — the export
        uses :meth:`save_hf`, which holds one shard on rank 0 at a time)."""
        return {n: t.cpu() for n, t in self.iter_named_params(256 * 2**20)}

    def save_hf(self, out_dir: str | Path, tokenizer: Any | None = None, max_shard_bytes: int = 5 * 2**30) -> None:
        """Export an HF checkpoint to ``out_dir``, consolidated on rank 0 only (collective).

        Every rank takes part in the ZeRO-3 gathers bucket by bucket (16-bit parameters under bf16/fp16
        training); only rank 0 copies each gathered tensor to host memory and streams it into safetensors shards
        of at most ``max_shard_bytes`` (:func:`trainer.checkpoint.write_hf_shards`), so no rank ever holds the
        full state dict. Rank 0 also writes ``config.json`` (its ``dtype`` = the exported tensors' dtype), the
        generation config and the tokenizer.
        """
        from .checkpoint import write_hf_shards

        main = self.dist.is_main
        named = ((n, t.cpu() if t is not None else None)
                 for n, t in self.iter_named_params(self.cfg.rollout.sync_bucket_mb * 2**20, materialize=main))
        dtype = write_hf_shards(named, out_dir, max_shard_bytes=max_shard_bytes, write=main)
        if main:
            module = self.engine.module
            module.config.save_pretrained(str(out_dir))
            _set_config_dtype(Path(out_dir) / "config.json", dtype)
            if getattr(module, "generation_config", None) is not None:
                module.generation_config.save_pretrained(str(out_dir))
            if tokenizer is not None:
                tokenizer.save_pretrained(str(out_dir))

    # ------------------------------------------------------------------------------------------------------------
    # memory during the rollout (trainer.memory.ColocatedSchedule)
    # ------------------------------------------------------------------------------------------------------------

    def offload_states(self) -> None:
        """Move DeepSpeed's optimizer states, fp32 master partitions and gradient buffers to pinned host memory
        (``DeepSpeedEngine.offload_states``; ZeRO-3 with DeepSpeed's FusedAdam, ``optim.optimizer=deepspeed_adamw``).
        The 16-bit parameter partitions stay: the weight sync gathers them."""
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as S

        self.engine.offload_states(include=[S.optim_states, S.hp_params, S.lp_grads, S.contiguous_grad_buffer],
                                   pin_memory=True)

    def reload_states(self) -> None:
        """Undo :meth:`offload_states` (``DeepSpeedEngine.reload_states``)."""
        self.engine.reload_states()


def _set_config_dtype(path: Path, dtype: torch.dtype | None) -> None:
    """Write the exported tensors' dtype into ``config.json`` (``dtype`` and the older ``torch_dtype`` key)."""
    import json

    if dtype is None:
        return
    data = json.loads(path.read_text())
    name = str(dtype).removeprefix("torch.")
    for key in ("dtype", "torch_dtype"):
        if key in data or key == "dtype":
            data[key] = name
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _lr_scheduler(optimizer: torch.optim.Optimizer, cfg: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """Warm-up then constant / linear / cosine decay over ``schedule.total_steps`` (multiplier of ``optim.lr``)."""
    import math

    o, total = cfg.optim, cfg.schedule.total_steps

    def mult(step: int) -> float:
        if o.warmup_steps and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        frac = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
        return 1.0 - frac if o.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, mult)
