"""Config machinery: YAML + dotted overrides, validation errors naming key, value and allowed range."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from stare_lab.config import (
    check_range,
    LossConfig,
    STAREConfig,
    apply_overrides,
    from_dict,
    load_config,
    parse_overrides,
    to_dict,
)
from stare_lab.errors import ConfigError, StareLabError


def test_defaults_match_paper():
    """Defaults are the paper's 7B settings (docs/theory.md §4) and DAPO clip-higher (docs/theory.md §3)."""
    s = STAREConfig()
    assert (s.variant, s.top_p_ratio, s.reweight_w, s.reweight_m, s.target_entropy) == ("O1", 0.1, 1.1, 0.9, 0.3)
    assert (s.adaptive, s.alpha, s.w_max, s.m_min, s.scope) == (False, 0.01, 1.5, 0.5, "global")
    c = LossConfig()
    assert (c.clip_ratio_low, c.clip_ratio_high, c.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert c.loss_agg_mode == "token-mean"


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("loss_mode: stare\nstare:\n  variant: c2\n  reweight_w: 1.2\n")
    cfg = load_config(p, ["stare.reweight_m=0.8", "clip_ratio_high=0.3"])
    assert cfg.loss_mode == "stare"
    assert cfg.stare.variant == "C2"  # normalised to upper case
    assert cfg.stare.reweight_w == 1.2 and cfg.stare.reweight_m == 0.8
    assert cfg.clip_ratio_high == 0.3
    # round trip through to_dict/from_dict
    assert from_dict(LossConfig, to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("stare.top_p_ratio=1.5", "stare.top_p_ratio=1.5 is outside [0, 1]"),
        ("stare.top_p_ratio=-0.1", "stare.top_p_ratio=-0.1 is outside [0, 1]"),
        ("stare.reweight_w=0.9", "stare.reweight_w=0.9 is outside [1, inf)"),
        ("stare.reweight_m=1.1", "stare.reweight_m=1.1 is outside (0, 1]"),
        ("stare.reweight_m=0", "stare.reweight_m=0 is outside (0, 1]"),
        ("stare.variant=C3", "stare.variant='C3' is not one of {'O1', 'C2'}"),
        ("stare.scope=rank", "stare.scope='rank' is not one of {'global', 'microbatch'}"),
        ("stare.target_entropy=-1", "stare.target_entropy=-1 is outside [0, inf]"),
        ("stare.adaptive=maybe", "stare.adaptive='maybe' must be true or false"),
        ("clip_ratio_c=0.5", "clip_ratio_c=0.5 is outside (1, inf]"),
        ("loss_agg_mode=mean", "loss_agg_mode='mean' is not one of"),
        ("kl_estimator=k4", "kl_estimator='k4' is not one of {'k1', 'k2', 'k3'}"),
        ("entropy_coeff=nan", "entropy_coeff=nan must be a number"),
        ("clip_ratio_low=inf", "clip_ratio_low=inf must be finite"),
        ("kl_coef=abc", "kl_coef='abc' must be a number"),
        ("unknown_key=1", "unknown config key unknown_key"),
        ("stare.bogus=1", "unknown config key stare.bogus"),
        ("stare=3", "stare=3 must be a mapping"),
        ("no_equals_sign", "must look like key=value"),
    ],
)
def test_bad_values_are_named(override, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert fragment in str(info.value)
    assert isinstance(info.value, StareLabError)


def test_printed_range_holds_only_accepted_values():
    """Fresh-user review: a missing bound prints closed ("inf]") only where infinity is accepted (allow_inf),
    else open — lr=inf is refused as not finite, so lr's range must not read "(0, inf]"."""
    with pytest.raises(ConfigError, match=re.escape("x=0 is outside (0, inf)")):
        check_range("x", 0, 0, None, lo_open=True)
    with pytest.raises(ConfigError, match=re.escape("x=5 is outside (-inf, 1]")):
        check_range("x", 5, None, 1)
    with pytest.raises(ConfigError, match=re.escape("x=inf must be finite")):
        check_range("x", math.inf, 0, None, lo_open=True)
    with pytest.raises(ConfigError, match=re.escape("x=-1 is outside [0, inf]")):
        check_range("x", -1, 0, None, allow_inf=True)
    check_range("x", math.inf, 0, None, allow_inf=True)  # accepted: the closed bracket is true


def test_adaptive_bounds_checked_only_when_adaptive():
    # W above w_max is fine with a fixed schedule (w_max is unused) ...
    assert load_config(None, ["stare.reweight_w=3"]).stare.reweight_w == 3
    # ... but contradicts the bounds of the adaptive schedule.
    with pytest.raises(ConfigError, match="stare.w_max=1.5 is below stare.reweight_w=3.0"):
        load_config(None, ["stare.reweight_w=3", "stare.adaptive=true"])


@dataclasses.dataclass
class Algo:
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)


@dataclasses.dataclass
class Top:
    algorithm: Algo = dataclasses.field(default_factory=Algo)


def test_nested_prefix_in_wing_configs():
    """A wing's config that nests LossConfig gets errors with the full dotted key."""
    with pytest.raises(ConfigError, match=r"algorithm\.loss\.stare\.top_p_ratio=2 is outside"):
        load_config(None, ["algorithm.loss.stare.top_p_ratio=2"], Top)
    with pytest.raises(ConfigError, match=r"algorithm\.loss\.clip_ratio_low=-1 is outside"):
        load_config(None, ["algorithm.loss.clip_ratio_low=-1"], Top)
    assert load_config(None, ["algorithm.loss.stare.variant=c2"], Top).algorithm.loss.stare.variant == "C2"


def test_direct_construction_validates():
    with pytest.raises(ConfigError, match=r"stare\.top_p_ratio=2 is outside \[0, 1\]"):
        STAREConfig(top_p_ratio=2)


def test_override_parsing():
    assert parse_overrides(["a.b=1", "c=[1, 2]", "d=true", "e=hello", "f=1e-3"]) == [
        ("a.b", 1),
        ("c", [1, 2]),
        ("d", True),
        ("e", "hello"),
        ("f", 1e-3),
    ]
    d = apply_overrides({"a": {"x": 1}}, ["a.y=2", "b.c=3"])
    assert d == {"a": {"x": 1, "y": 2}, "b": {"c": 3}}
    with pytest.raises(ConfigError, match="is not a section"):
        apply_overrides({"a": 1}, ["a.b=2"])


def test_missing_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(lst)


def test_a_key_given_twice_is_refused():
    """Issue 29, item 7: `lr=1 lr=2` was taken silently (the last won); now one line names the key and both
    values. parse_overrides itself still takes repeated keys (a sweep grid parses its values through it)."""
    from stare_lab.config import apply_overrides, parse_overrides

    with pytest.raises(ConfigError, match=r"^override lr is given twice \(lr=1 and lr=2\); give it once$"):
        apply_overrides({}, ["lr=1", "lr=2"])
    with pytest.raises(ConfigError, match="override a.b is given twice"):
        apply_overrides({}, ["a.b=1", "c=2", " a.b =3"])
    assert apply_overrides({}, ["a.b=1", "a.c=2"]) == {"a": {"b": 1, "c": 2}}
    assert parse_overrides(["w=1", "w=2"]) == [("w", 1), ("w", 2)]
