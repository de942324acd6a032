"""What STAREGRPOTrainer takes from TRL, checked against the installed TRL (tested with 1.14.2 and 1.16.0; CI runs
this file with both, `make test-trl-compat`).

* The config: every field of the core's ``STAREConfig`` is a field of ``STAREGRPOConfig`` with the same default,
  and reaches the core (in Python and from the command line through ``HfArgumentParser``).
* The private surface: the module uses exactly the private TRL names of ``TRL_PRIVATE_NAMES`` (found by reading its
  source), each exists in the installed TRL, and every ``GRPOTrainer`` method the subclass overrides is public.
* Each adapter function behaves as TRL does: ``_trl_scores`` returns the log-probs and entropies of the model's own
  logits (log_softmax; H = −Σ p log p); ``_trl_step_micro_batches`` returns, when a step opens, the micro-batches
  TRL then trains, in order, by identity (a real run with gradient accumulation 2 and 4 micro-batches per
  generation); ``_trl_latest_reward`` is the mean of what the reward function returned for the generation batch.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _trl_common import GSM8K, _micro_batch, _require  # noqa: E402

_require("trl", "transformers", "datasets", "accelerate")

import trl  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from stare_lab.config import STAREConfig  # noqa: E402
from stare_lab.integrations import trl as stare_trl  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, corpus_file=GSM8K)


def test_the_trl_version_is_the_expected_one():
    """`make test-trl-compat` sets STARE_EXPECT_TRL=1.14.2 and puts that TRL first on the path: the tests below
    then really ran against it (elsewhere: any TRL of the extra's pin)."""
    expected = os.environ.get("STARE_EXPECT_TRL")
    if expected:
        assert trl.__version__ == expected
    major, minor = (int(x) for x in trl.__version__.split(".")[:2])
    assert (1, 14) <= (major, minor) <= (1, 16), trl.__version__


# --------------------------------------------------------------------------------------------------------------
# the config: derived from STAREConfig
# --------------------------------------------------------------------------------------------------------------


def test_every_stare_config_field_is_a_trl_config_field(tmp_path):
    """Each field of STAREConfig (today's and any added later) is a field of STAREGRPOConfig with the core's
    default, and a non-default value reaches ``stare_config()``."""
    core = {f.name: f for f in dataclasses.fields(STAREConfig)}
    ours = {f.name: f for f in dataclasses.fields(stare_trl.STAREGRPOConfig)}
    assert set(stare_trl.STARE_FIELDS) == set(core)
    for name, f in core.items():
        assert name in ours, f"STAREConfig.{name} is missing from STAREGRPOConfig"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            assert ours[name].default is None  # a nested config is a mapping, None meaning the core's default
        else:
            assert ours[name].default == default, name
        assert ours[name].metadata.get("help"), name
    cfg = stare_trl.STAREGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], gate="never",
                                    variant="c2", reweight_w=1.25, scope="microbatch")
    assert cfg.stare_config() == STAREConfig(gate="never", variant="C2", reweight_w=1.25, scope="microbatch")
    assert stare_trl.STAREGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[]).stare_config() == \
        STAREConfig()


def test_stare_fields_parse_from_the_command_line(tmp_path):
    """TRL scripts build their config with HfArgumentParser (``TrlParser``): the STARE fields are flags there."""
    from transformers import HfArgumentParser

    (cfg,) = HfArgumentParser(stare_trl.STAREGRPOConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "--report_to", "none", "--gate", "always", "--variant", "C2",
         "--reweight_m", "0.7", "--adaptive", "true", "--m_min", "0.6", "--quadrant_every", "0"])
    assert cfg.stare_config() == STAREConfig(gate="always", variant="C2", reweight_m=0.7, adaptive=True, m_min=0.6)
    assert cfg.quadrant_every == 0


# --------------------------------------------------------------------------------------------------------------
# the private surface
# --------------------------------------------------------------------------------------------------------------


def _private_names_used(tree: ast.AST) -> set[str]:
    """Every private name the code (not its docstrings) reads on an object — ``x._name`` or
    ``getattr(x, "_name")`` — minus the names the integration defines itself (functions, classes, methods and the
    attributes it assigns)."""
    used, own = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            used.add(node.attr)
            if isinstance(node.ctx, ast.Store):
                own.add(node.attr)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr"):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and str(node.args[1].value)[:1] == "_":
                used.add(node.args[1].value)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            own.add(node.name)
    return used - own


def test_private_trl_names_are_exactly_the_adapters():
    """The module reads no private TRL name outside TRL_PRIVATE_NAMES, and each is read only in its adapter
    function. Before this surface was cut it used 11 (5 overridden, 2 called, 4 attributes); now 4, none
    overridden."""
    module = ast.parse(Path(stare_trl.__file__).read_text())
    assert _private_names_used(module) == set(stare_trl.TRL_PRIVATE_NAMES)
    for name, (_, adapter) in stare_trl.TRL_PRIVATE_NAMES.items():
        others = [n for n in module.body if getattr(n, "name", None) != adapter]
        assert name in _private_names_used(ast.parse(inspect.getsource(getattr(stare_trl, adapter)))), name
        assert all(name not in _private_names_used(n) for n in others), f"{name} is used outside {adapter}"


def test_overridden_trl_methods_are_public():
    """Every GRPOTrainer attribute the subclass redefines is public (no private TRL method is overridden)."""
    overridden = {n for n in vars(stare_trl.STAREGRPOTrainer) if hasattr(GRPOTrainer, n) and not n.startswith("__")}
    assert overridden == {"compute_loss", "log", "train"}
    assert "_get_per_token_logps_and_entropies" in vars(GRPOTrainer)


# --------------------------------------------------------------------------------------------------------------
# the adapters against TRL's behaviour
# --------------------------------------------------------------------------------------------------------------


def _tiny_trainer(model_dir, out, cls=None, reward=None, **kw):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    args = dict(output_dir=str(out), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4,
                num_generations=4, max_completion_length=8, learning_rate=1e-3, logging_steps=1, save_strategy="no",
                seed=0, target_entropy=100.0, variant="C2")
    cfg = stare_trl.STAREGRPOConfig(**{**args, **kw})
    ds = Dataset.from_list([{"prompt": f"prompt {i}"} for i in range(16)])
    reward = reward or (lambda completions, **k: [float(len(c) % 3) for c in completions])
    return (cls or stare_trl.STAREGRPOTrainer)(model=model, processing_class=tok, reward_funcs=reward, args=cfg,
                                               train_dataset=ds)


def test_trl_scores_are_the_models_logprobs_and_entropies(tmp_path, tiny_model):
    """``_trl_scores`` (TRL's private scoring forward) returns, per completion token, log π(token) and
    H = −Σ p log p of the model's own logits (computed here with log_softmax), to float tolerance."""
    trainer = _tiny_trainer(tiny_model, tmp_path)
    batch = _micro_batch(len(trainer.processing_class))
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logps, ent, aux = stare_trl._trl_scores(trainer, trainer.model, ids, att, 12, batch_size=None, aux=False)
        logits = trainer.model(input_ids=ids, attention_mask=att).logits[:, -13:-1].float()
    logp_all = torch.log_softmax(logits, -1)
    mask = batch["completion_mask"].bool()
    expected = logp_all.gather(-1, batch["completion_ids"][..., None])[..., 0]
    assert logps.shape == ent.shape == mask.shape and aux is None
    assert torch.allclose(logps[mask], expected[mask], atol=1e-5)
    assert torch.allclose(ent[mask], -(logp_all.exp() * logp_all).sum(-1)[mask], atol=1e-5)


def test_step_micro_batches_and_reward_follow_trl(tmp_path, tiny_model):
    """A real run, 2 optimizer steps of 2 micro-batches, 4 micro-batches per generation batch: when each step opens,
    ``_trl_step_micro_batches`` returns exactly the objects TRL then passes to ``compute_loss``, in order; and
    ``_trl_latest_reward`` is the mean of the reward function's outputs for the generation batch that step trains
    on (recorded as the reward function returns them)."""
    opened, seen, rewards = [], [], []

    def reward(completions, **kw):
        out = [float(len(c) % 3) for c in completions]
        rewards.append(sum(out) / len(out))
        return out

    class Recording(stare_trl.STAREGRPOTrainer):
        def _stare_open_step(self, micro):
            opened.append(list(micro))
            super()._stare_open_step(micro)
            opened[-1].append(self._stare_reward)

        def compute_loss(self, model, inputs, *a, **k):
            seen.append(inputs)
            return super().compute_loss(model, inputs, *a, **k)

    trainer = _tiny_trainer(tiny_model, tmp_path, cls=Recording, reward=reward, gradient_accumulation_steps=2,
                            steps_per_generation=4, max_steps=2)
    trainer.train()
    assert len(opened) == 2 and len(seen) == 4 and len(rewards) == 1  # one generation batch for both steps
    for k, step in enumerate(opened):
        assert step[0] is seen[2 * k] and step[1] is seen[2 * k + 1]
        assert step[2] == pytest.approx(rewards[0], abs=1e-6)
    assert len({id(x) for x in seen}) == 4


def test_step_micro_batches_refuses_a_changed_buffer(tmp_path, tiny_model):
    """If TRL stops buffering as ``_buffered_inputs[_step % steps_per_generation]``, the adapter says so in one
    line instead of selecting over the wrong tokens."""
    from stare_lab.errors import RunError

    trainer = _tiny_trainer(tiny_model, tmp_path, gradient_accumulation_steps=2, steps_per_generation=2)
    a, b = {"x": 1}, {"x": 2}
    trainer._buffered_inputs, trainer._step = [a, b], 0
    assert stare_trl._trl_step_micro_batches(trainer, a, 2) == [a, b]
    with pytest.raises(RunError, match="no longer buffers"):
        stare_trl._trl_step_micro_batches(trainer, b, 2)
