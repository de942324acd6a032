"""The HF export of a checkpoint: consolidated on rank 0 only and streamed into safetensors shards
(trainer.engines.weights.write_hf_shards, trainer.engines.policy.PolicyEngine.save_hf)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trainer.engines.weights import INDEX_FILE, SINGLE_FILE, write_hf_shards


def test_shards_are_written_while_the_tensors_stream():
    """Five 400-byte tensors into shards of at most 1000 bytes: [t0, t1], [t2, t3], [t4]. Each shard is on disk
    before the tensors after it are even produced, so at most one shard is ever held."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        seen = []

        def tensors():
            for k in range(5):
                seen.append(len(list(out.glob("shard-*.tmp"))))  # shards on disk when tensor k is produced
                yield f"t{k}", torch.full((100,), float(k))  # 100 float32 = 400 bytes

        dtype = write_hf_shards(tensors(), out, max_shard_bytes=1000)
        assert seen == [0, 0, 0, 1, 1]  # t2 overflows shard 0: it is flushed when t2 arrives, before t3 is made
        index = json.loads((out / INDEX_FILE).read_text())
        assert index["metadata"]["total_size"] == 2000 and dtype == torch.float32
        files = sorted(p.name for p in out.glob("model-*.safetensors"))
        assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
        assert index["weight_map"] == {"t0": files[0], "t1": files[0], "t2": files[1], "t3": files[1],
                                       "t4": files[2]}
        from safetensors.torch import load_file

        assert torch.equal(load_file(str(out / files[2]))["t4"], torch.full((100,), 4.0))


def test_one_shard_is_a_single_model_safetensors(tmp_path):
    write_hf_shards(iter([("a", torch.ones(3)), ("b", torch.zeros(2))]), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [SINGLE_FILE]


def test_other_ranks_take_part_but_keep_and_write_nothing(tmp_path):
    pulled = []

    def tensors():
        for k in range(3):
            pulled.append(k)
            yield f"t{k}", None  # what iter_named_params(materialize=False) yields: no copy

    assert write_hf_shards(tensors(), tmp_path / "x", write=False) is None
    assert pulled == [0, 1, 2] and not (tmp_path / "x").exists()


def test_sharded_export_loads_with_from_pretrained(tiny_model, tmp_path):
    """The tiny model's parameters exported in ~60 KB shards load back with transformers, weights identical."""
    import shutil

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    out = tmp_path / "export"
    write_hf_shards(((n, p.detach().clone()) for n, p in model.named_parameters()), out, max_shard_bytes=60_000)
    assert len(list(out.glob("model-*.safetensors"))) > 2
    shutil.copy(tiny_model / "config.json", out / "config.json")
    again = AutoModelForCausalLM.from_pretrained(out)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("rank", [0, 1])
def test_save_hf_consolidates_on_rank_zero_only(tmp_path, rank):
    """PolicyEngine.save_hf on a 2-rank job: every rank runs the gathers; only rank 0 copies tensors (materialize)
    and writes files."""
    from trainer.engines.policy import PolicyEngine

    calls = []

    class Module:
        config = SimpleNamespace(save_pretrained=lambda d: Path(d, "config.json").write_text('{"dtype": "x"}'))
        generation_config = None

    def iter_named_params(bucket_bytes, materialize=True):
        calls.append(materialize)
        for k in range(2):
            yield f"w{k}", torch.ones(4) if materialize else None

    fake = SimpleNamespace(dist=SimpleNamespace(is_main=rank == 0), cfg=SimpleNamespace(
        rollout=SimpleNamespace(sync_bucket_mb=1.0)), iter_named_params=iter_named_params,
        engine=SimpleNamespace(module=Module()))
    out = tmp_path / "hf"
    PolicyEngine.save_hf(fake, out)
    assert calls == [rank == 0]
    if rank == 0:
        assert (out / SINGLE_FILE).is_file()
        assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    else:
        assert not out.exists()
