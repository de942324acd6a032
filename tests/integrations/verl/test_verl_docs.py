"""The launch documented in docs/integrations-verl.md ("The reference's 7B run on mainline verl") is valid for verl
0.9.1 as written: the shell block runs with ``python3`` replaced by a function that records its arguments, the
arguments compose with verl's own Hydra config, the actor config builds the way verl's workers build it, and the
plugin reads from it the reference's 7B settings (README of hp-luo/STARE: O1, P 0.1, W 1.1, M 0.9, H_tgt 0.3,
fixed weights; per-micro-batch selection; clip 0.2 / 0.28, c 10)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from verl.utils.config import omega_conf_to_dataclass

from stare_lab.integrations.verl import STAREPolicyLossConfig, loss_config_from_actor

sys.path.insert(0, str(Path(__file__).parent))
from _verl_cases import compose  # noqa: E402

DOC = Path(__file__).resolve().parents[3] / "docs" / "integrations-verl.md"


def _launch_args(tmp_path: Path, heading: str = "## The reference's 7B run on mainline verl") -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split(heading, 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    out = tmp_path / "args"
    script = f"python3() {{ printf '%s\\0' \"$@\" > {out}; }}\n{block}"
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], check=True, timeout=60)
    return out.read_bytes().decode().split("\0")[:-1]


def test_documented_launch_composes_in_verl_and_names_the_reference_settings(tmp_path):
    args = _launch_args(tmp_path)
    assert args[:2] == ["-m", "verl.trainer.main_ppo"] and len(args) > 60
    cfg = compose(args[2:])
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "stare"
    assert list(cfg.trainer.logger) == ["console", "wandb", "file"]
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, STAREPolicyLossConfig) and actor.rollout_n == 8
    loss = loss_config_from_actor(actor)
    s = loss.stare
    assert (s.variant, s.top_p_ratio, s.reweight_w, s.reweight_m, s.target_entropy, s.adaptive, s.scope, s.gate) == (
        "O1", 0.1, 1.1, 0.9, 0.3, False, "microbatch", "entropy")
    assert (loss.clip_ratio_low, loss.clip_ratio_high, loss.clip_ratio_c, loss.loss_agg_mode) == (
        0.2, 0.28, 10.0, "token-mean")
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6 and cfg.data.train_batch_size == 64
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 64 and cfg.algorithm.filter_groups.enable
    assert cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == 8


def test_documented_multi_node_launch_composes_in_verl(tmp_path):
    """The scale-out section's launch (docs/integrations-verl.md "Scale-out: Ray on several nodes"): 2 nodes × 8
    GPUs, Ray's address for verl's ``ray.init``, TransferQueue sized, the STARE run directory on shared storage."""
    args = _launch_args(tmp_path, "## Scale-out: Ray on several nodes")
    assert args[:2] == ["-m", "verl.trainer.main_ppo"]
    cfg = compose(args[2:])
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 8)
    assert cfg.ray_kwargs.ray_init.address == "auto" and cfg.trainer.v1.trainer_mode == "stare"
    assert cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == 8
    assert cfg.trainer.stare_run_dir.endswith("stare_run")
    loss = loss_config_from_actor(cfg.actor_rollout_ref.actor)  # the driver's view (the rest of the 7B keys omitted)
    assert (loss.stare.variant, loss.stare.scope) == ("O1", "global")


def test_gpu_check_script_dry_run_collects_the_real_tests(tmp_path):
    """``scripts/verl_gpu_check.sh --dry-run`` (the GPU run's script on CPU, docs "A GPU run") finds verl, Ray and
    TransferQueue and hands test_verl_real.py to pytest with 4 steps on CPU; here it only collects (the tests
    themselves run in this suite). Without Ray importable it stops at once with the reason (exit 2)."""
    root = DOC.parents[1]
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(root)}
    out = subprocess.run(["bash", "scripts/verl_gpu_check.sh", "--dry-run", "--out", str(tmp_path), "--",
                          "--collect-only", "-q"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "tests/integrations/verl/test_verl_real.py: 3" in out.stdout  # all but the CPU-only setup test
    assert (tmp_path / "verl_gpu_check.log").is_file()
    blocker = tmp_path / "noray"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nclass _Block:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray':\n            raise ImportError('No module named ray (blocked for the test)')\n"
        "sys.meta_path.insert(0, _Block())\n")
    env["PYTHONPATH"] = f"{blocker}{os.pathsep}{root}"
    out = subprocess.run(["bash", "scripts/verl_gpu_check.sh", "--dry-run"], cwd=root, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2 and "75.6 MiB" in out.stderr and out.stderr.count("\n") == 1, out.stderr[-2000:]
