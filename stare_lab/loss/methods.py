"""Method names shared by simulators, trainer and analysis, and what each implies (docs/theory.md §3–4).

A *method* (``grpo``, ``o1``, …) names a training recipe; :data:`METHODS` maps it onto the policy-loss registry
(:mod:`stare_lab.loss.losses`) plus the two switches that live outside the loss: DAPO dynamic sampling
(``dynamic_sampling``) and the entropy bonus (``entropy_bonus``: the method needs ``loss.entropy_coeff > 0``).
Simulators build configs from it (:func:`method_overrides`); the trainer checks a config against it
(:func:`check_method`). A loss registered outside the package (``stare_lab.loss.losses.register_policy_loss``) becomes a
method with :func:`register_method` (and stops being one with :func:`unregister_method`); the wings read
:data:`METHODS` when they validate, so nothing else is edited.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from stare_lab.config import LossConfig, join_key
from stare_lab.errors import ConfigError

__all__ = ["METHODS", "BUILTIN_METHODS", "method_overrides", "check_method", "register_method", "unregister_method"]

#: method name → ``{"loss": LossConfig fields (``stare`` a nested STAREConfig dict), "dynamic_sampling": bool}``
#: plus ``"entropy_bonus": True`` for the method that needs ``loss.entropy_coeff > 0``.
METHODS: dict[str, dict[str, Any]] = {
    "grpo": {"loss": {"loss_mode": "grpo"}, "dynamic_sampling": False},
    "grpo-ds": {"loss": {"loss_mode": "grpo"}, "dynamic_sampling": True},
    "o1": {"loss": {"loss_mode": "stare", "stare": {"variant": "O1", "adaptive": False}}, "dynamic_sampling": False},
    "c2": {"loss": {"loss_mode": "stare", "stare": {"variant": "C2"}}, "dynamic_sampling": False},
    "o1-adaptive": {
        "loss": {"loss_mode": "stare", "stare": {"variant": "O1", "adaptive": True, "schedule": "paper"}},
        "dynamic_sampling": False,
    },
    "o1-auto": {
        "loss": {"loss_mode": "stare", "stare": {"variant": "O1", "adaptive": True, "schedule": "auto"}},
        "dynamic_sampling": False,
    },
    "c2-auto": {
        "loss": {"loss_mode": "stare", "stare": {"variant": "C2", "adaptive": True, "schedule": "auto"}},
        "dynamic_sampling": False,
    },
    "clip_cov": {"loss": {"loss_mode": "clip_cov"}, "dynamic_sampling": False},
    "kl_cov": {"loss": {"loss_mode": "kl_cov"}, "dynamic_sampling": False},
    "entropy_bonus": {"loss": {"loss_mode": "grpo"}, "dynamic_sampling": False, "entropy_bonus": True},
    "forking_tokens": {"loss": {"loss_mode": "forking_tokens"}, "dynamic_sampling": False},
}
#: the methods defined here; they cannot be unregistered
BUILTIN_METHODS = tuple(METHODS)


def register_method(
    name: str,
    loss_mode: str,
    *,
    stare: dict[str, Any] | None = None,
    dynamic_sampling: bool = False,
    entropy_bonus: bool = False,
) -> None:
    """Add a method to :data:`METHODS` (e.g. for a loss registered outside the package).

    Args:
        name: the new method label (non-empty, not yet in :data:`METHODS`).
        loss_mode: a registered policy-loss name (``stare_lab.loss.losses.available_policy_losses()``).
        stare: ``loss.stare`` settings the method fixes (``STAREConfig`` field names), for STARE-based methods.
        dynamic_sampling: the method needs DAPO dynamic sampling.
        entropy_bonus: the method needs ``loss.entropy_coeff > 0``.

    Raises:
        ConfigError: an empty or taken name, an unregistered ``loss_mode``, or an unknown ``stare`` key.
    """
    from stare_lab.config import STAREConfig
    from stare_lab.loss.losses import available_policy_losses  # registers the built-in losses

    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"method name {name!r} must be a non-empty string")
    if name in METHODS:
        raise ConfigError(f"method {name!r} is already defined; choose another name")
    if loss_mode not in available_policy_losses():
        raise ConfigError(
            f"method {name!r}: loss_mode={loss_mode!r} is not a registered loss (one of "
            f"{{{', '.join(available_policy_losses())}}}); register it with register_policy_loss first"
        )
    fields = {f.name for f in dataclasses.fields(STAREConfig)}
    unknown = sorted(set(stare or {}) - fields)
    if unknown:
        raise ConfigError(f"method {name!r}: unknown loss.stare key {unknown[0]!r}; allowed: {', '.join(sorted(fields))}")
    spec: dict[str, Any] = {"loss": {"loss_mode": loss_mode}, "dynamic_sampling": bool(dynamic_sampling)}
    if stare:
        spec["loss"]["stare"] = dict(stare)
    if entropy_bonus:
        spec["entropy_bonus"] = True
    METHODS[name] = spec


def unregister_method(name: str) -> None:
    """Remove a method added with :func:`register_method` (its loss stays registered).

    Raises:
        ConfigError: ``name`` is not in :data:`METHODS`, or is a built-in method (:data:`BUILTIN_METHODS`).
    """
    if name not in METHODS:
        raise ConfigError(f"method {name!r} is not defined (one of {{{', '.join(METHODS)}}})")
    if name in BUILTIN_METHODS:
        raise ConfigError(f"method {name!r} is built in and cannot be unregistered")
    del METHODS[name]


def method_overrides(method: str) -> dict[str, Any]:
    """The settings ``method`` implies, as a nested dict (a deep copy of ``METHODS[method]``).

    Raises:
        ConfigError: if ``method`` is not in :data:`METHODS` (the message lists the allowed names).
    """
    if method not in METHODS:
        raise ConfigError(f"method={method!r} is not one of {{{', '.join(METHODS)}}}")
    return copy.deepcopy(METHODS[method])


def check_method(
    method: str, loss: LossConfig, *, dynamic_sampling: bool | None = None, prefix: str = ""
) -> None:
    """Check that a config matches what a known method label implies (unknown labels are free-form: no check).

    For ``grpo-ds`` dynamic sampling must be on (when ``dynamic_sampling`` is given); plain ``grpo`` may still use
    it (the paper's GRPO-ds baseline is GRPO + dynamic sampling, and STARE runs use it too).

    Raises:
        ConfigError: naming the dotted key (under ``prefix``) that contradicts the method.
    """
    spec = METHODS.get(method)
    if spec is None:
        return
    key = lambda name: join_key(prefix, name)  # noqa: E731
    want = spec["loss"]
    if loss.loss_mode != want["loss_mode"]:
        raise ConfigError(
            f"{key('method')}={method!r} needs {key('loss.loss_mode')}={want['loss_mode']!r}, got {loss.loss_mode!r}"
        )
    for name, value in want.get("stare", {}).items():
        got = getattr(loss.stare, name)
        if got != value:
            raise ConfigError(
                f"{key('method')}={method!r} needs {key('loss.stare.' + name)}={value!r}, got {got!r}"
            )
    if spec["dynamic_sampling"] and dynamic_sampling is False:
        raise ConfigError(f"{key('method')}={method!r} needs {key('algorithm.dynamic_sampling')}=true")
    if spec.get("entropy_bonus") and loss.entropy_coeff <= 0:
        raise ConfigError(f"{key('method')}={method!r} needs {key('loss.entropy_coeff')} > 0")
