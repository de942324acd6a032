"""Dataclass configs: YAML + dotted ``key=value`` overrides, validated with clear errors.

Every config in stare_lab (core, simulators, trainer) is a tree of dataclasses. This module owns

* the generic machinery: :func:`from_dict` (dict → dataclass, type-checked, unknown keys rejected),
  :func:`to_dict`, :func:`apply_overrides` (dotted ``a.b=value`` strings, values parsed as YAML scalars),
  :func:`load_config` (YAML file + overrides → dataclass) and the validation helpers used in
  ``__post_init__`` methods (:func:`check_range`, :func:`check_choice`, …);
* the core's own configs: :class:`STAREConfig` (docs/theory.md §4) and :class:`LossConfig` (docs/theory.md §3).

Every error is a :class:`~stare_lab.errors.ConfigError` whose message names the dotted key, the bad value and
what is allowed, e.g. ``stare.top_p_ratio=1.5 is outside [0, 1]``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

from stare_lab.errors import ConfigError

T = TypeVar("T")

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")

__all__ = [
    "STAREConfig",
    "LossConfig",
    "from_dict",
    "to_dict",
    "apply_overrides",
    "parse_overrides",
    "split_paths",
    "load_config",
    "config_data",
    "load_yaml",
    "expand_shorthand",
    "check_range",
    "check_choice",
    "check_positive",
    "check_finite",
    "config_prefix",
    "join_key",
]


# ----------------------------------------------------------------------------------------------------------------
# validation helpers (used by __post_init__ of every config dataclass)
# ----------------------------------------------------------------------------------------------------------------


_PREFIX: contextvars.ContextVar[str | None] = contextvars.ContextVar("stare_lab_config_prefix", default=None)


def config_prefix(default: str) -> str:
    """The dotted key prefix of the config being built: the one :func:`from_dict` is building under, else
    ``default``. Config dataclasses call it in ``__post_init__`` so errors name the full dotted key."""
    prefix = _PREFIX.get()
    return default if prefix is None else prefix


def join_key(prefix: str, name: str) -> str:
    """``join_key("loss", "stare") == "loss.stare"``; ``join_key("", "x") == "x"``."""
    return f"{prefix}.{name}" if prefix else name


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, float) and not isinstance(value, bool):
        return format(value, "g")
    return str(value)


def check_finite(key: str, value: Any) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key}={_fmt(value)} must be a finite number")


def check_range(
    key: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    allow_inf: bool = False,
) -> None:
    """Raise :class:`ConfigError` unless ``lo (<|<=) value (<|<=) hi``.

    The message reads like ``stare.top_p_ratio=1.5 is outside [0, 1]``. A missing bound prints as ``-inf`` /
    ``inf``, closed (``[0, inf]``) only with ``allow_inf`` (an infinite value is accepted), else open
    (``(0, inf)``): the printed range is exactly the set of accepted values.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{key}={_fmt(value)} must be a number")
    if not allow_inf and math.isinf(value):
        raise ConfigError(f"{key}={_fmt(value)} must be finite")
    bad = (lo is not None and (value < lo or (lo_open and value == lo))) or (
        hi is not None and (value > hi or (hi_open and value == hi))
    )
    if bad:
        left = "(" if lo_open or (lo is None and not allow_inf) else "["
        right = ")" if hi_open or (hi is None and not allow_inf) else "]"
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise ConfigError(f"{key}={_fmt(value)} is outside {left}{lo_s}, {hi_s}{right}")


def check_positive(key: str, value: Any, *, integer: bool = False, allow_zero: bool = False) -> None:
    """Raise :class:`ConfigError` unless ``value`` > 0 (or ≥ 0 with ``allow_zero``); ints only with ``integer``."""
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key}={_fmt(value)} must be an integer")
    check_range(key, value, 0, None, lo_open=not allow_zero)


def check_choice(key: str, value: Any, choices: Iterable[Any]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``."""
    choices = list(choices)
    if value not in choices:
        allowed = ", ".join(_fmt(c) for c in choices)
        raise ConfigError(f"{key}={_fmt(value)} is not one of {{{allowed}}}")


# ----------------------------------------------------------------------------------------------------------------
# core configs
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class STAREConfig:
    """STARE settings (docs/theory.md §4; key names follow the reference implementation hp-luo/STARE).

    Attributes:
        variant: ``"O1"`` (×W on the high-surprisal positive-advantage set L+) or ``"C2"`` (also ×M on L−).
            Lower case is accepted and normalised.
        top_p_ratio: P ∈ [0, 1]; each selected set has k = max(1, ⌈P·|T±|⌉) tokens.
        reweight_w: W ≥ 1, the weight on L+ (paper: 1.1 for 7B, 1.05 for 14B/32B).
        reweight_m: M ∈ (0, 1], the weight on L− (C2 only; paper: 0.9 for 7B, 0.95 for 14B/32B).
        target_entropy: H_tgt ≥ 0 in nats; the gate is on when the batch token-mean entropy is below it.
        adaptive: W (and M) change from step to step, by the rule ``schedule`` names.
        schedule: the rule of an adaptive run: ``"paper"`` (the paper's W ← clip(W + α·sgn(H_tgt − H̄), [1, w_max]),
            M ← clip(M − α·sgn(H_tgt − H̄), [m_min, 1])) or ``"auto"`` (the balance controller of
            :mod:`stare_lab.loss.controller`: from the first crossing of H_tgt it finds the W that cancels the entropy
            drift, in [1, auto_w_max], with M = 1/W for C2; docs/theory.md §9). ``"auto"`` needs ``adaptive``.
        alpha: step α > 0 of the paper's schedule.
        w_max: upper bound of W under the paper's schedule (≥ reweight_w when ``adaptive``).
        m_min: lower bound of M under the paper's schedule (≤ reweight_m when ``adaptive``, > 0).
        auto_w_max: upper bound of W under the auto schedule (> 1): a safety cap, not a guess of the answer; the run
            reports the share of the steps from the crossing of H_tgt on at it (``w_cap_share``).
        scope: ``"global"`` (selection over the whole optimizer batch; invariant to micro-batching) or
            ``"microbatch"`` (selection per loss call, as the reference implementation does).
        gate: ``"entropy"`` (the paper's gate, on iff H̄ < target_entropy), ``"always"`` (forced on) or
            ``"never"`` (forced off: exact GRPO).
    """

    variant: str = "O1"
    top_p_ratio: float = 0.1
    reweight_w: float = 1.1
    reweight_m: float = 0.9
    target_entropy: float = 0.3
    adaptive: bool = False
    schedule: str = "paper"
    alpha: float = 0.01
    w_max: float = 1.5
    m_min: float = 0.5
    auto_w_max: float = 20.0
    scope: str = "global"
    gate: str = "entropy"

    def __post_init__(self) -> None:
        self.validate(config_prefix("stare"))

    @property
    def w_cap(self) -> float | None:
        """The cap on W of the adaptive schedule (``auto_w_max`` for ``auto``, ``w_max`` for ``paper``); None when W
        is fixed."""
        if not self.adaptive:
            return None
        return float(self.auto_w_max if self.schedule == "auto" else self.w_max)

    def validate(self, prefix: str = "stare") -> None:
        """Check every field; raise :class:`ConfigError` naming ``prefix.key``."""
        p = prefix + "." if prefix else ""
        if isinstance(self.variant, str):
            self.variant = self.variant.upper()
        check_choice(f"{p}variant", self.variant, ["O1", "C2"])
        check_range(f"{p}top_p_ratio", self.top_p_ratio, 0, 1)
        check_range(f"{p}reweight_w", self.reweight_w, 1, None)
        check_range(f"{p}reweight_m", self.reweight_m, 0, 1, lo_open=True)
        check_range(f"{p}target_entropy", self.target_entropy, 0, None, allow_inf=True)
        if not isinstance(self.adaptive, bool):
            raise ConfigError(f"{p}adaptive={_fmt(self.adaptive)} must be true or false")
        check_range(f"{p}alpha", self.alpha, 0, None, lo_open=True)
        check_range(f"{p}w_max", self.w_max, 1, None)
        check_range(f"{p}m_min", self.m_min, 0, 1, lo_open=True)
        if self.adaptive and self.schedule == "paper" and self.w_max < self.reweight_w:
            raise ConfigError(
                f"{p}w_max={self.w_max} is below {p}reweight_w={self.reweight_w}; need w_max >= reweight_w"
            )
        if self.adaptive and self.schedule == "paper" and self.m_min > self.reweight_m:
            raise ConfigError(
                f"{p}m_min={self.m_min} is above {p}reweight_m={self.reweight_m}; need m_min <= reweight_m"
            )
        check_choice(f"{p}scope", self.scope, ["global", "microbatch"])
        check_choice(f"{p}gate", self.gate, ["entropy", "always", "never"])
        check_choice(f"{p}schedule", self.schedule, ["paper", "auto"])
        check_range(f"{p}auto_w_max", self.auto_w_max, 1, None, lo_open=True)
        if self.schedule == "auto" and not self.adaptive:
            raise ConfigError(f"{p}schedule='auto' adapts W: it needs {p}adaptive=true (the methods o1-auto and "
                              "c2-auto set both)")
        if self.schedule == "auto" and self.reweight_w > self.auto_w_max:
            raise ConfigError(f"{p}reweight_w={self.reweight_w} (auto's starting W) is above "
                              f"{p}auto_w_max={self.auto_w_max}")


@dataclasses.dataclass
class LossConfig:
    """Policy-loss settings shared by every loss in the registry (docs/theory.md §3, §4; verl key names).

    Attributes:
        loss_mode: registry name of the policy loss (``grpo``, ``stare``, ``clip_cov``, ``kl_cov``,
            ``forking_tokens``, …); callers pass it to ``compute_policy_loss``.
        clip_ratio_low: ε_low ≥ 0 of the clipped surrogate (ratio floor 1 − ε_low).
        clip_ratio_high: ε_high ≥ 0 (ratio ceiling 1 + ε_high; DAPO clip-higher 0.28).
        clip_ratio_c: dual-clip constant c > 1 applied to negative advantages only.
        loss_agg_mode: ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum`` or
            ``seq-mean-token-sum-norm``.
        loss_scale_factor: constant divisor for ``seq-mean-token-sum-norm`` (Dr. GRPO's L_max); ``None`` uses
            the response length T of the inputs.
        entropy_coeff: β ≥ 0 of the entropy bonus L = L_PG − β·H̄ (needs ``entropy`` in the inputs).
        kl_coef: coefficient ≥ 0 of the KL penalty to the reference policy (needs ``ref_logprobs``).
        kl_estimator: ``k1``, ``k2`` or ``k3`` (Schulman's estimators of KL(π_θ ‖ π_ref)).
        tis_cap: cap C of truncated importance sampling min(π_old/π_rollout, C); ``None`` disables it.
        tis_level: ``token`` (one ratio per token) or ``sequence`` (one ratio per sequence: the product of its
            token ratios) for the importance correction.
        tis_mode: ``truncate`` (w = min(ρ, C)) or ``mask`` (w = ρ inside [1/C, C], else 0).
        clip_cov_ratio: r of Clip-Cov (fraction of tokens whose gradient is detached).
        clip_cov_lb: ω_lo of Clip-Cov.
        clip_cov_ub: ω_hi of Clip-Cov.
        kl_cov_ratio: r of KL-Cov (top-k by covariance, k = max(1, r·N)).
        ppo_kl_coef: β of KL-Cov's |log ρ| penalty.
        top_entropy_quantile: fraction of tokens (highest entropy, global quantile) that keep their gradient
            in ``forking_tokens`` (0.2 = the 80/20 rule).
        stare: the STARE settings (:class:`STAREConfig`).
        params: hyperparameters of a loss registered outside the package (``register_policy_loss``), read by that
            loss as ``config.params[name]``: a mapping from names to YAML scalars or lists (``loss.params.beta=0.5``
            on the command line). The built-in losses never read it; it lands in ``config.yaml`` like every field.
    """

    loss_mode: str = "grpo"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float = 10.0
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    entropy_coeff: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    tis_cap: float | None = None
    tis_level: str = "token"
    tis_mode: str = "truncate"
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-3
    ppo_kl_coef: float = 1.0
    top_entropy_quantile: float = 0.2
    stare: STAREConfig = dataclasses.field(default_factory=STAREConfig)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)

    AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

    def __post_init__(self) -> None:
        self.validate(config_prefix("loss"))

    def validate(self, prefix: str = "loss") -> None:
        """Check every field; raise :class:`ConfigError` naming ``prefix.key``."""
        p = prefix + "." if prefix else ""
        if not isinstance(self.loss_mode, str) or not self.loss_mode:
            raise ConfigError(f"{p}loss_mode={_fmt(self.loss_mode)} must be a loss name")
        check_range(f"{p}clip_ratio_low", self.clip_ratio_low, 0, 1)
        check_range(f"{p}clip_ratio_high", self.clip_ratio_high, 0, None)
        check_range(f"{p}clip_ratio_c", self.clip_ratio_c, 1, None, lo_open=True, allow_inf=True)
        check_choice(f"{p}loss_agg_mode", self.loss_agg_mode, self.AGG_MODES)
        if self.loss_scale_factor is not None:
            check_range(f"{p}loss_scale_factor", self.loss_scale_factor, 0, None, lo_open=True)
        check_range(f"{p}entropy_coeff", self.entropy_coeff, 0, None)
        check_range(f"{p}kl_coef", self.kl_coef, 0, None)
        check_choice(f"{p}kl_estimator", self.kl_estimator, ["k1", "k2", "k3"])
        if self.tis_cap is not None:
            check_range(f"{p}tis_cap", self.tis_cap, 0, None, lo_open=True)
        check_choice(f"{p}tis_level", self.tis_level, ["token", "sequence"])
        check_choice(f"{p}tis_mode", self.tis_mode, ["truncate", "mask"])
        if self.tis_mode == "mask" and self.tis_cap is not None and self.tis_cap < 1:
            raise ConfigError(f"{p}tis_cap={self.tis_cap} must be >= 1 with {p}tis_mode=mask (kept range [1/C, C])")
        check_range(f"{p}clip_cov_ratio", self.clip_cov_ratio, 0, 1)
        check_finite(f"{p}clip_cov_lb", self.clip_cov_lb)
        check_finite(f"{p}clip_cov_ub", self.clip_cov_ub)
        if self.clip_cov_lb > self.clip_cov_ub:
            raise ConfigError(
                f"{p}clip_cov_lb={self.clip_cov_lb} is above {p}clip_cov_ub={self.clip_cov_ub}"
            )
        check_range(f"{p}kl_cov_ratio", self.kl_cov_ratio, 0, 1)
        check_range(f"{p}ppo_kl_coef", self.ppo_kl_coef, 0, None)
        check_range(f"{p}top_entropy_quantile", self.top_entropy_quantile, 0, 1, lo_open=True)
        if isinstance(self.stare, STAREConfig):
            self.stare.validate(join_key(prefix, "stare"))
        if not isinstance(self.params, Mapping):
            raise ConfigError(f"{p}params={_fmt(self.params)} must be a mapping of names to values")
        for name, value in self.params.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{p}params has a key {name!r}: keys must be non-empty strings")
            if not _is_plain_value(value):
                raise ConfigError(f"{p}params.{name}={_fmt(value)} must be a number, string, boolean, null or a list "
                                  "of those")


def _is_plain_value(value: Any) -> bool:
    """True for a YAML scalar (None, bool, int, finite or infinite float, str) or a list/tuple of them."""
    if isinstance(value, (list, tuple)):
        return all(_is_plain_value(v) and not isinstance(v, (list, tuple)) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


# ----------------------------------------------------------------------------------------------------------------
# dict <-> dataclass
# ----------------------------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert ``value`` (from YAML / JSON / an override) to the annotated type ``tp`` or raise ConfigError."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:  # Optional[X]: X's own error names the nested key and what is allowed
            if isinstance(value, bool) and non_none[0] is not bool and type(None) in args:
                kind = {float: "a number", int: "an integer", str: "a string"}.get(non_none[0], _type_name(non_none[0]))
                raise ConfigError(f"{key}={_fmt(value)} must be {kind} or null (YAML reads "
                                  "off/on/no/yes as false/true: write null for none)")
            return _coerce(key, value, non_none[0])
        for arg in non_none:
            try:
                return _coerce(key, value, arg)
            except ConfigError as err:
                errors.append(str(err))
        allowed = " or ".join(_type_name(a) if a is not type(None) else "null" for a in args)
        raise ConfigError(f"{key}={_fmt(value)} must be {allowed}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={_fmt(value)} must be a mapping of {tp.__name__} fields")
        return from_dict(tp, value, prefix=key)
    if origin in (list, tuple) or tp in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={_fmt(value)} must be a list")
        item_tp = args[0] if args else Any
        items = [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={_fmt(value)} must be a mapping")
        return dict(value)
    if origin is typing.Literal:
        check_choice(key, value, args)
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={_fmt(value)} must be true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}={_fmt(value)} must be an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}={_fmt(value)} must be an integer")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}={_fmt(value)} must be a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}={_fmt(value)} must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}={_fmt(value)} must be a string")
    return value


def from_dict(cls: type[T], data: Mapping[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a (nested) mapping; missing keys take the dataclass defaults.

    Raises:
        ConfigError: on an unknown key (with the allowed keys), a value of the wrong type, or any error raised by
            the dataclass's own validation (``__post_init__``).
    """
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"unknown config key {where}{unknown[0]}; allowed keys{' under ' + prefix if prefix else ''}: "
            + ", ".join(sorted(fields))
        )
    kwargs = {}
    for name, value in data.items():
        key = join_key(prefix, name)
        kwargs[name] = _coerce(key, value, hints[name])
    token = _PREFIX.set(prefix)
    try:
        return cls(**kwargs)
    finally:
        _PREFIX.reset(token)


def to_dict(obj: Any) -> Any:
    """Dataclass tree → plain dicts/lists/scalars (YAML/JSON-serialisable)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


# ----------------------------------------------------------------------------------------------------------------
# YAML and overrides
# ----------------------------------------------------------------------------------------------------------------


def _yaml():
    try:
        import yaml  # lazily: `import stare_lab` needs only torch and numpy
    except ImportError as err:  # pragma: no cover - PyYAML is a dependency
        raise ConfigError("reading YAML configs needs PyYAML: pip install pyyaml") from err
    return yaml


def split_paths(words: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split command-line words into (paths, ``key=value`` overrides), each in order: a word is an override when it
    holds ``=`` and is not an existing path (a sweep's run directories are named like ``W=6``)."""
    paths, overrides = [], []
    for w in map(str, words):
        (overrides if "=" in w and not Path(w).exists() else paths).append(w)
    return paths, overrides


def parse_overrides(overrides: Iterable[str]) -> list[tuple[str, Any]]:
    """Parse ``["a.b=1", "c=[1, 2]"]`` into ``[("a.b", 1), ("c", [1, 2])]``; values are YAML scalars/lists.

    Raises:
        ConfigError: on a string without ``=`` or with an empty key.
    """
    yaml = _yaml()
    parsed = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. stare.reweight_w=1.2)")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} has an empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads "1e-3" as a string
        elif isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "-inf", "nan"):
            value = float(value)
        parsed.append((key, value))
    return parsed


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply dotted ``key=value`` overrides to a nested dict (in place) and return it.

    Intermediate mappings are created as needed; unknown keys are caught later by :func:`from_dict`.

    Raises:
        ConfigError: if an override descends into a key that holds a non-mapping value, or a key is given twice
            (``lr=1 lr=2``: which one was meant is not known, so neither is taken).
    """
    items = list(overrides)
    seen: dict[str, str] = {}
    for item, (key, _) in zip(items, parse_overrides(items)):
        if key in seen:
            raise ConfigError(f"override {key} is given twice ({seen[key]} and {item.strip()}); give it once")
        seen[key] = item.strip()
    for key, value in parse_overrides(items):
        node = data
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def expand_shorthand(overrides: Iterable[str]) -> list[str]:
    """Dotted ``key=value`` overrides with the shorthand ``stare.KEY=V`` written out as ``loss.stare.KEY=V`` (the
    STARE settings live under ``loss`` in every config; ``stare-lab simulate``, ``train`` and ``promote`` accept
    both spellings)."""
    return ["loss." + o if str(o).startswith("stare.") else str(o) for o in overrides]


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from ``path``.

    Raises:
        ConfigError: if the file is missing, unreadable, larger than 16 MiB, not UTF-8, not valid YAML, or not a
            mapping at top level (one line naming the file and line: :func:`stare_lab.platform.files.read_yaml`).
    """
    from stare_lab.platform.files import read_yaml

    return read_yaml(path, "config file", ConfigError)


def load_config(
    path: str | Path | Mapping[str, Any] | None,
    overrides: Iterable[str] = (),
    cls: type[T] = LossConfig,  # type: ignore[assignment]
) -> T:
    """Load a config of dataclass type ``cls`` from a YAML file (or a mapping, or ``None`` for the defaults),
    apply dotted ``key=value`` overrides, and validate.

    Example: ``load_config("o1.yaml", ["stare.reweight_w=1.2"], LossConfig)``.

    Raises:
        ConfigError: missing/invalid file, unknown key, wrong type, or a value outside its allowed range.
    """
    return from_dict(cls, config_data(path, overrides))


def config_data(path: str | Path | Mapping[str, Any] | None, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """The raw config mapping of a YAML file (or a mapping, or ``None`` for empty) with dotted ``key=value``
    overrides applied, before any dataclass sees it (:func:`load_config`, the trainer's config loader).

    Raises:
        ConfigError: missing/invalid file, or a malformed override.
    """
    if path is None:
        data: dict[str, Any] = {}
    elif isinstance(path, Mapping):
        data = to_dict(dict(path))
    else:
        data = load_yaml(path)
    return apply_overrides(data, overrides)
