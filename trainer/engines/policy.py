"""The policy engine: a DeepSpeed-wrapped Hugging Face causal LM with the trainer's jobs — per-token log-probs and
entropies (the core's chunked, temperature-scaled functions), the update with the step's global normalisers,
gradients of other objectives for the first-order predictions (:mod:`trainer.step.prediction`), and a bucketed
parameter iterator for the weight sync.

Micro-batches are row slices of the step's padded :class:`trainer.step.batch.RolloutBatch`, packed greedily by a token
budget (``rows × longest sequence ≤ optim.micro_batch_max_tokens``); each is cut to its own longest sequence.
Because ZeRO-3 gathers parameters with collectives in every forward, all ranks run the same number of
forwards/backwards per pass: a rank with fewer micro-batches runs dummy ones whose loss is ``0 · Σ logits`` (zero
gradient, every parameter touched so the gradient hooks match). Gradients accumulate over the micro-batches of a
pass; the last backward of a pass is DeepSpeed's gradient-accumulation boundary
(``set_gradient_accumulation_boundary``), so the reduction over ranks happens once, for every ZeRO stage. (Without
it, ZeRO-1/2 with one accumulation step per backward keep only the last micro-batch's gradient — measured here.)

Loss normalisation (docs/theory.md §3): each micro-batch loss is ``compute_policy_loss(...)`` with the inputs of
:meth:`stare_lab.loss.step.PreparedStep.inputs` — ``global_num_tokens``/``global_num_sequences`` counted over the whole
optimizer step (all micro-batches, all ranks) — so summing the micro-batch gradients gives the gradient of the
full-batch loss; DeepSpeed then *averages* gradients over the data-parallel ranks, which we undo by multiplying each
loss by the world size. The update is therefore independent of the micro-batch size and of the number of ranks
(tested in tests/trainer).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor

from stare_lab.loss.entropy import entropy_from_logits, logprobs_from_logits

from .probe_passes import ProbePasses

logger = logging.getLogger(__name__)

__all__ = ["PolicyEngine", "pack_micro_batches", "LossFn"]

#: ``loss_fn(micro_batch, logprobs [b, t], entropy [b, t] | None) -> 0-dim loss``: the micro-batch's part of a
#: step objective (already divided by the step's global normaliser).
LossFn = Callable[[Any, Tensor, "Tensor | None"], Tensor]


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


class PolicyEngine(ProbePasses):
    """DeepSpeed engine around ``AutoModelForCausalLM`` (ZeRO 0–3, bf16/fp16/fp32, optional offload and gradient
    checkpointing), with a client torch AdamW (or DeepSpeed's) and an LR schedule.

    Args:
        cfg: a :class:`trainer.config.TrainerConfig`.
        model_dir: the HF model directory to start from.
        dist: a :class:`trainer.engines.launch.DistInfo`.
    """

    def __init__(self, cfg: Any, model_dir: str | Path, dist: Any) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM
        from transformers.integrations import HfDeepSpeedConfig

        from trainer.engines.launch import deepspeed_json

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
        self._kept: tuple | None = None
        self._tangent: tuple | None = None  # (rows, micro-batch, logits, GraphTangent, leaves) of the probe
        self._trims: bool | None = None  # the module's forward takes logits_to_keep (checked on first use)
        # seconds (wall clock, process CPU) of the last logprobs_and_entropy_grad's backward passes
        self.entropy_grad_s = self.entropy_grad_cpu_s = 0.0
        self._fusable = not _has_dropout(model)
        self.temperature = cfg.rollout.temperature
        self.max_tokens = o.micro_batch_max_tokens

    # ------------------------------------------------------------------------------------------------------------
    # forward
    # ------------------------------------------------------------------------------------------------------------

    def micro_plan(self, batch: Any, comm: Any) -> list[Tensor]:
        """The step's micro-batches: ``[b]`` int64 row tensors of ``batch``, padded with empty ones (dummies) to the
        largest count over the ranks (one collective). The same plan serves every pass of the step."""
        plan = [torch.tensor(mb, dtype=torch.long)
                for mb in pack_micro_batches(batch.seq_lens.tolist(), self.max_tokens)]
        n_max = int(comm.max({"micro_batches": len(plan)})["micro_batches"])
        return plan + [torch.zeros(0, dtype=torch.long) for _ in range(n_max - len(plan))]

    def _dummy_forward(self) -> Tensor:
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        return self.engine(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().sum()

    def _forward(self, mb: Any, *, need_entropy: bool, entropy_grad: bool,
                 params: dict[str, Tensor] | None = None) -> tuple[Tensor, Tensor | None]:
        """Log-probs ``[b, t]`` of the micro-batch's response tokens (with their graph) and, if asked, their
        entropies (with the graph iff ``entropy_grad``), at the rollout temperature, nats. ``params``: run the
        module with these tensors in place of its parameters (``torch.func.functional_call``), outside DeepSpeed."""
        if params is None:
            logits = self.engine(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits  # [b, L, V]
            resp_logits = torch.gather(logits, 1, mb.positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        else:
            resp_logits = self._functional_logits(mb, params)
        logprobs = logprobs_from_logits(resp_logits, mb.tokens, self.temperature)
        entropy = None
        if need_entropy:
            entropy = entropy_from_logits(resp_logits if entropy_grad else resp_logits.detach(), self.temperature)
        return logprobs, entropy

    def _functional_logits(self, mb: Any, params: dict[str, Tensor]) -> Tensor:
        """The response logits ``[b, t, V]`` of the module run with ``params`` (``torch.func.functional_call``,
        outside DeepSpeed). The output layer is applied only from the first response position of the micro-batch on
        (the model's ``logits_to_keep``, when its forward takes it): the probes need no prompt logits."""
        module = self.engine.module
        kwargs: dict[str, Any] = {"attention_mask": mb.attention_mask}
        start = 0
        if self._trims is None:
            import inspect

            self._trims = "logits_to_keep" in inspect.signature(module.forward).parameters
        if self._trims:
            start = int(mb.positions.min())
            kwargs["logits_to_keep"] = mb.input_ids.shape[1] - start
        logits = torch.func.functional_call(module, params, (mb.input_ids,), kwargs).logits
        index = (mb.positions - start).unsqueeze(-1).expand(-1, -1, logits.shape[-1])
        return torch.gather(logits, 1, index)

    def compute_logprobs(self, batch: Any, plan: Sequence[Tensor], *, keep_graph: bool = False,
                         entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies (nats) of ``batch``'s response tokens under the current policy at the rollout
        temperature: two ``[B, T]`` float32 CPU tensors, 0 on padding. Collective: every rank must call it.

        ``keep_graph`` (only for a one-micro-batch plan, on a model without dropout: :attr:`fusable`): the forward
        runs in training mode with its graph kept, and the next :meth:`update` (or :meth:`backward`) reuses it
        instead of a second forward of the same rows — the old log-probs of an on-policy step then are the update's
        own, bit for bit (tested); ``entropy_grad`` keeps the entropy's graph too (an entropy bonus).
        :meth:`release` drops a kept graph that will not be used."""
        if keep_graph and (len(plan) != 1 or not self.fusable):
            raise ValueError("keep_graph needs a plan of one micro-batch and a model without dropout")
        self.release()
        (self.engine.train if keep_graph else self.engine.eval)()
        shape = batch.response_ids.shape
        lps, ents = torch.zeros(shape), torch.zeros(shape)
        with torch.set_grad_enabled(keep_graph):
            for rows in plan:
                if not rows.numel():
                    dummy = self._dummy_forward()
                    self._kept = (rows, None, dummy, None) if keep_graph else None
                    continue
                mb = batch.micro_batch(rows, self.device)
                lp, ent = self._forward(mb, need_entropy=True, entropy_grad=keep_graph and entropy_grad)
                if keep_graph:
                    self._kept = (rows, mb, lp, ent)
                t = lp.shape[1]
                zero = torch.zeros((), device=lp.device)
                lps[rows, :t] = torch.where(mb.valid, lp.detach().float(), zero).cpu()
                ents[rows, :t] = torch.where(mb.valid, ent.detach().float(), zero).cpu()
        return lps, ents

    def release(self) -> None:
        """Drop the graphs kept by :meth:`compute_logprobs` (``keep_graph``) and :meth:`logprobs_and_entropy_grad`,
        if any."""
        self._kept = self._tangent = None

    @property
    def fusable(self) -> bool:
        """True when the model has no active dropout, so the old-log-prob forward (eval mode) and the update's
        (train mode) compute the same numbers and one forward can serve both (:meth:`compute_logprobs`)."""
        return self._fusable

    # ------------------------------------------------------------------------------------------------------------
    # gradients and the update
    # ------------------------------------------------------------------------------------------------------------

    def backward(self, batch: Any, plan: Sequence[Tensor], loss_fn: LossFn, *, need_entropy: bool = False,
                 entropy_grad: bool = False, use_kept: bool = False) -> None:
        """Accumulate the gradient of a step objective: for every micro-batch of ``plan``, forward, ``loss_fn`` and
        ``engine.backward(loss × world size)`` (accumulated; reduced over ranks by the next ``step()``, or per
        backward into ZeRO-2/3 partitions). ``use_kept``: the forward kept by :meth:`compute_logprobs` serves the
        (only) micro-batch. Collective."""
        self.engine.train()
        world = self.dist.world_size
        kept, self._kept = (self._kept, None) if use_kept else (None, self._kept)
        for rows in plan:
            if kept is not None:  # the old-log-prob forward of this (only) micro-batch, graph kept
                _, mb, lp, ent = kept
                kept = None
                if mb is None:
                    self.engine.backward(lp * 0.0, scale_wrt_gas=False)
                    continue
            elif not rows.numel():
                self.engine.backward(self._dummy_forward() * 0.0, scale_wrt_gas=False)
                continue
            else:
                mb = batch.micro_batch(rows, self.device)
                lp, ent = self._forward(mb, need_entropy=need_entropy, entropy_grad=entropy_grad)
            # DeepSpeed averages gradients over ranks; × world size makes the sum over ranks of Σ_tokens / N_global
            self.engine.backward(loss_fn(mb, lp, ent) * world, scale_wrt_gas=False)

    def update(self, batch: Any, plan: Sequence[Tensor], prep: Any, comm: Any) -> dict[str, float]:
        """One optimizer step of the loss ``prep.config.loss_mode`` over ``batch`` (collective).

        Args:
            batch: this rank's :class:`trainer.step.batch.RolloutBatch`.
            plan: :meth:`micro_plan`.
            prep: the step's :class:`stare_lab.loss.step.PreparedStep` (gate, W/M, ω, normalisers, global statistics).
            comm: the :class:`trainer.engines.comm.Comm`.

        Returns:
            token-weighted means of the loss metrics over all ranks (``loss/...``), ``loss/total`` (the step loss,
            summed over micro-batches and ranks), ``grad_norm`` and ``lr``.
        """
        from stare_lab.loss.losses import compute_policy_loss, loss_metric_names

        cfg, needs = prep.config, prep.needs
        # the keys every rank sums, also a rank without micro-batches: the loss's declared metric names
        names = loss_metric_names(cfg.loss_mode, cfg, entropy=needs.entropy_grad or prep.batch.entropy is not None)
        sums = {k: 0.0 for k in names if k != "loss/total"}
        sums.update({"__tokens": 0.0, "loss/total": 0.0})

        def loss_fn(mb: Any, lp: Tensor, ent: Tensor | None) -> Tensor:
            inputs = prep.inputs(lp, mb.rows, entropy=ent if needs.entropy_grad else None)
            loss, metrics = compute_policy_loss(cfg.loss_mode, inputs, cfg)
            ntok = float(inputs.response_mask.sum())
            sums["__tokens"] += ntok
            sums["loss/total"] += float(loss.detach())
            for k, v in metrics.items():
                if k in sums and k != "loss/total":
                    sums[k] += float(v) * ntok
            return loss

        self.backward(batch, plan, loss_fn, need_entropy=needs.entropy_grad, entropy_grad=needs.entropy_grad,
                      use_kept=True)
        plain_norm = None if self.engine.zero_optimization() else self._grad_norm(comm)
        self.engine.step()
        red = comm.sum(sums)
        n_tok = max(red.pop("__tokens"), 1.0)
        out = {(k if k.startswith("loss/") else f"loss/{k}"): (v if k == "loss/total" else v / n_tok)
               for k, v in red.items()}
        gn = self.engine.get_global_grad_norm() if plain_norm is None else plain_norm
        out["grad_norm"] = float(gn) if gn is not None else None
        out["lr"] = float(self.engine.get_lr()[0])
        return out

    def _grad_norm(self, comm: Any) -> float:
        """‖g‖₂ of the accumulated rank-averaged gradient before the step, without a ZeRO optimizer (ZeRO stage 0,
        where DeepSpeed does not keep the norm it clips with): the ranks' ``p.grad`` are not reduced before
        ``step()``, so the norm is taken of their mean (one all-reduce of the flattened gradient)."""
        grads = [p.grad.reshape(-1).float() for p in self.engine.module.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        flat = torch.cat(grads)
        if comm.world_size > 1:
            import torch.distributed as tdist

            tdist.all_reduce(flat)
            flat /= comm.world_size
        return float(flat.double().norm())

    def gradient(self, batch: Any, plan: Sequence[Tensor], loss_fn: LossFn, *, need_entropy: bool = False,
                 entropy_grad: bool = False) -> list[Tensor]:
        """The gradient of a step objective (summed over ranks), one float32 tensor per parameter: this rank's
        partition under ZeRO-3 (as :meth:`local_view`), the full tensor otherwise. It never changes what the next
        :meth:`update` computes (tested). Collective.

        ZeRO-3: :meth:`backward`, a copy of the reduced partitions (``safe_get_local_grad``), then the accumulated
        gradients are cleared (``optimizer.zero_grad``: the next backward overwrites instead of accumulating).
        ZeRO 0–2: ``torch.autograd.grad`` through the module called with detached leaves of its parameters
        (``torch.func.functional_call``), so DeepSpeed's gradient hooks and buffers are never touched; then one
        all-reduce of the flattened gradient."""
        if self.zero3:
            self.backward(batch, plan, loss_fn, need_entropy=need_entropy, entropy_grad=entropy_grad)
            grads = [g.detach().float().clone() for g in self.local_view("grad")]
            self.engine.optimizer.zero_grad()
            self.engine.zero_grad()
            return grads
        self.engine.train()
        module = self.engine.module
        leaves = {n: p.detach().requires_grad_(True) for n, p in module.named_parameters()}
        grads = [torch.zeros_like(p, dtype=torch.float32) for p in leaves.values()]
        for rows in plan:
            if not rows.numel():  # no parameter gathers outside ZeRO-3: a missing micro-batch needs no dummy
                continue
            mb = batch.micro_batch(rows, self.device)
            lp, ent = self._forward(mb, need_entropy=need_entropy, entropy_grad=entropy_grad, params=leaves)
            got = torch.autograd.grad(loss_fn(mb, lp, ent), list(leaves.values()), allow_unused=True)
            for acc, g in zip(grads, got):
                if g is not None:
                    acc += g.float()
        if self.dist.world_size > 1:
            import torch.distributed as tdist

            flat = torch.cat([g.reshape(-1) for g in grads])
            tdist.all_reduce(flat)
            grads = [t.view_as(g) for t, g in zip(flat.split([g.numel() for g in grads]), grads)]
        return grads

    def local_view(self, kind: str) -> list[Tensor]:
        """Per parameter, the part this rank holds of: ``"param"`` (fp32 master weights), ``"grad"`` (ZeRO-3 only:
        the accumulated, rank-averaged gradient partition, between a pass and the step) or ``"exp_avg_sq"``
        (Adam's second moment; after a step). ZeRO-3: the rank's flat partition (:attr:`partitioned`: sums over
        these must be all-reduced); ZeRO 0–2: the full tensor, the same on every rank."""
        from deepspeed import utils as dsu

        if self.zero3:
            get = {"param": dsu.safe_get_local_fp32_param, "grad": dsu.safe_get_local_grad,
                   "exp_avg_sq": lambda p: dsu.safe_get_local_optimizer_state(p, "exp_avg_sq")}[kind]
            return [get(p) for p in self.engine.module.parameters()]
        full = {"param": dsu.safe_get_full_fp32_param, "grad": dsu.safe_get_full_grad,
                "exp_avg_sq": lambda p: dsu.safe_get_full_optimizer_state(p, "exp_avg_sq")}[kind]
        opt = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)
        plain = {"param": lambda p: p.data, "grad": lambda p: p.grad,
                 "exp_avg_sq": lambda p: opt.state[p]["exp_avg_sq"]}[kind]
        out = []
        for p in self.engine.module.parameters():
            t = full(p)  # None without a ZeRO optimizer (stage 0 in fp32): the parameter itself holds it
            out.append(plain(p) if t is None else t)
        return out

    @property
    def partitioned(self) -> bool:
        """True when :meth:`local_view` returns partitions (ZeRO-3), so per-rank sums must be all-reduced."""
        return self.zero3

    def adam_settings(self) -> dict[str, float]:
        """The AdamW settings of the coming step: ``lr`` (after the schedule), ``beta1``, ``beta2``, ``eps``,
        ``weight_decay`` and ``step`` (the number of optimizer steps taken so far)."""
        opt = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)
        group = opt.param_groups[0]
        state = next((s for s in opt.state.values() if "step" in s), None)
        step = group.get("step", 0) if state is None else state["step"]
        return {"lr": float(group["lr"]), "beta1": float(group["betas"][0]), "beta2": float(group["betas"][1]),
                "eps": float(group["eps"]), "weight_decay": float(group.get("weight_decay", 0.0)),
                "step": float(step)}

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
        of at most ``max_shard_bytes`` (:func:`trainer.engines.weights.write_hf_shards`), so no rank ever holds the
        full state dict. Rank 0 also writes ``config.json`` (its ``dtype`` = the exported tensors' dtype), the
        generation config and the tokenizer.
        """
        from trainer.engines.weights import write_hf_shards

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
    # memory during the rollout (trainer.engines.memory.ColocatedSchedule)
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


def _has_dropout(model: torch.nn.Module) -> bool:
    """True if the model drops anything in training mode: a ``Dropout`` module with p > 0, or a config rate
    (``attention_dropout``, ``hidden_dropout``, … — every config attribute whose name ends in ``dropout``) > 0."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    cfg = getattr(model, "config", None)
    rates = [getattr(cfg, k) for k in dir(cfg) if k.endswith("dropout") and not k.startswith("_")] if cfg else []
    return any(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in rates)


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
