"""Fixtures of the verl plugin tests (run in ``.venv-verl``): the composed launch config and verl's actor config."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _verl_cases import STARE_OVERRIDES, compose  # noqa: E402


@pytest.fixture(scope="session")
def verl_config():
    """The composed config (OmegaConf) of the documented STARE launch."""
    return compose(STARE_OVERRIDES)


@pytest.fixture(scope="session")
def actor_config(verl_config):
    """verl's ``FSDPActorConfig`` built from it the way verl's workers build theirs."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(verl_config.actor_rollout_ref.actor)
