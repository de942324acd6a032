"""The verl plugin's STARE settings are the core's: :class:`STAREPolicyLossConfig` has one field per field of
:class:`stare_lab.config.STAREConfig` (same name, type, default), derived from ``dataclasses.fields`` rather than
copied, and so do ``STARE_KEYS`` and the lines ``stare-lab promote --format verl`` writes. A field added to the core
config (e.g. a new schedule) therefore reaches verl's Hydra config without an edit here; the tests fail if one is
missing on verl's side."""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

import pytest
from verl.utils.config import omega_conf_to_dataclass

import stare_lab.integrations.verl as plugin
from stare_lab.config import STAREConfig
from stare_lab.errors import ConfigError
from stare_lab.integrations.verl import STARE_KEYS, STAREPolicyLossConfig, loss_config_from_actor
from trainer.planning import promote

sys.path.insert(0, str(Path(__file__).parent))
from _verl_cases import STARE_OVERRIDES, compose  # noqa: E402

#: a valid non-default value per STAREConfig field (hand-chosen; fields without one are covered by the structural
#: test only)
NON_DEFAULT = {"variant": "C2", "top_p_ratio": 0.25, "reweight_w": 1.2, "reweight_m": 0.8, "target_entropy": 0.7,
               "adaptive": True, "alpha": 0.02, "w_max": 1.4, "m_min": 0.6, "scope": "microbatch", "gate": "always"}


def test_every_core_stare_field_is_a_verl_policy_loss_field_with_the_same_default():
    core = {f.name: f for f in dataclasses.fields(STAREConfig)}
    verl = {f.name: f for f in dataclasses.fields(STAREPolicyLossConfig)}
    missing = sorted(set(core) - set(verl))
    assert not missing, f"STAREConfig fields missing from verl's STAREPolicyLossConfig: {missing}"
    hints, verl_hints = typing.get_type_hints(STAREConfig), typing.get_type_hints(STAREPolicyLossConfig)
    default = STAREConfig()
    for name in core:
        assert getattr(STAREPolicyLossConfig(), name) == getattr(default, name), name
        assert verl_hints[name] == hints[name], name
    assert STARE_KEYS == tuple(core) == promote._VERL_STARE_KEYS
    assert STAREPolicyLossConfig().stare_config() == default


def test_a_field_added_to_the_core_config_is_derived(monkeypatch):
    """A STAREConfig with one more field (as the core gains one) gives verl's config that field too: the plugin
    reads the core's fields, it does not list them."""

    @dataclasses.dataclass
    class Grown(STAREConfig):
        schedule: str = "paper"

    monkeypatch.setattr(plugin, "STAREConfig", Grown)
    fields = {name: spec.default for name, _, spec in plugin._stare_fields()}
    assert fields["schedule"] == "paper" and set(fields) == {f.name for f in dataclasses.fields(Grown)}


def test_each_setting_reaches_the_core_through_verls_hydra_config():
    """Every STARE key set with a ``+…policy_loss.<key>=`` override arrives in the core's config, both from the
    dataclass verl's workers build and from the OmegaConf node the driver holds; a bad value is one ConfigError
    naming verl's key."""
    assert set(NON_DEFAULT) <= set(STARE_KEYS)
    base = [o for o in STARE_OVERRIDES if not o.startswith("+actor_rollout_ref.actor.policy_loss.")]
    cfg = compose(base + [f"+actor_rollout_ref.actor.policy_loss.{k}={v}" for k, v in NON_DEFAULT.items()])
    from_node = loss_config_from_actor(cfg.actor_rollout_ref.actor).stare
    from_dataclass = loss_config_from_actor(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)).stare
    for key, value in NON_DEFAULT.items():
        assert getattr(from_node, key) == value == getattr(from_dataclass, key), key
    bad = compose(base + ["+actor_rollout_ref.actor.policy_loss.top_p_ratio=1.5"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.policy_loss\.top_p_ratio=1\.5"):
        loss_config_from_actor(bad.actor_rollout_ref.actor)
