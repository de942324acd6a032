"""The launch documented in docs/integrations-verl.md ("The reference's 7B run on mainline verl") is valid for verl
0.9.1 as written: the shell block runs with ``python3`` replaced by a function that records its arguments, the
arguments compose with verl's own Hydra config, the actor config builds the way verl's workers build it, and the
plugin reads from it the reference's 7B settings (README of hp-luo/STARE: O1, P 0.1, W 1.1, M 0.9, H_tgt 0.3,
fixed weights; per-micro-batch selection; clip 0.2 / 0.28, c 10)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from verl.utils.config import omega_conf_to_dataclass

from stare_lab.integrations.verl import STAREPolicyLossConfig, loss_config_from_actor

sys.path.insert(0, str(Path(__file__).parent))
from _verl_cases import compose  # noqa: E402

DOC = Path(__file__).resolve().parents[3] / "docs" / "integrations-verl.md"


def _launch_args(tmp_path: Path) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## The reference's 7B run on mainline verl", 1)[1]
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
