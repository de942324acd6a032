"""The override keys of a simulator preset, with their values and allowed ranges (``stare-lab simulate --list-keys
[--preset P]``).

Every leaf field of the preset's config dataclass tree (the simulator's config, its sub-configs and the core's
``LossConfig`` / ``STAREConfig``) is one dotted key. Its value is the preset's (the preset's overrides on the
dataclass defaults, for the preset's first method); its description — meaning, unit and allowed range — is the
``Attributes:`` entry of the dataclass's docstring, the same text the API documentation shows (validation lives in
each dataclass's ``__post_init__``; a test checks that every key has an entry). Keys that a method sets are marked:
choose them with ``--methods``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
from typing import Any

from stare_lab.config import from_dict

from simulators.presets import get_preset
from simulators.sweep import CONFIGS, method_set_keys

__all__ = ["KeyInfo", "field_docs", "preset_keys", "format_keys"]

_ENTRY = re.compile(r"^(\w+(?:, \w+)*):\s?(.*)$")
_ROLE = re.compile(r":\w+:`~?([^`]+)`")  # :func:`x` -> x


@dataclasses.dataclass
class KeyInfo:
    """One override key: dotted ``key``, annotated ``type``, the preset's ``value``, ``doc`` (its docstring entry)
    and ``set_by_method`` (the method of the preset sets it)."""

    key: str
    type: str
    value: Any
    doc: str
    set_by_method: bool = False


def field_docs(cls: type) -> dict[str, str]:
    """Field name → its ``Attributes:`` entry in ``cls``'s docstring (continuation lines joined, reST markup
    removed); an entry for several names (``a, b: …``) is given to each."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    out: dict[str, str] = {}
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:") + 1
    except StopIteration:
        return out
    names: list[str] = []
    for line in lines[start:]:
        if line.strip() and not line.startswith("    "):
            break  # the next section
        text = line[4:] if line.startswith("    ") else line
        text = _ROLE.sub(r"\1", text).replace("``", "")
        m = _ENTRY.match(text) if not text.startswith(" ") else None
        if m:
            names = m.group(1).split(", ")
            for n in names:
                out[n] = m.group(2).strip()
        elif names and text.strip():
            for n in names:
                out[n] += " " + text.strip()
    return out


def _walk(obj: Any, prefix: str = "") -> list[KeyInfo]:
    docs = field_docs(type(obj))
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out += _walk(value, key + ".")
        else:
            out.append(KeyInfo(key, str(f.type), copy.deepcopy(value), docs.get(f.name, "")))
    return out


def preset_keys(preset: str) -> list[KeyInfo]:
    """The override keys of ``preset`` (module docstring), in the dataclasses' field order; ``method`` and ``seed``
    (chosen with ``--methods`` / ``--seeds``) are left out; ``set_by_method`` marks the keys one of the preset's
    methods sets.

    Raises:
        ConfigError: unknown preset.
    """
    spec = get_preset(preset)
    cls = CONFIGS[spec["kind"]]
    methods = spec.get("methods") or ["grpo"]
    data = copy.deepcopy(spec["overrides"])
    data["method"] = methods[0]
    config = from_dict(cls, data)
    set_by = set().union(*(method_set_keys(m) for m in methods))
    keys = [k for k in _walk(config) if k.key not in ("method", "seed")]
    for k in keys:
        k.set_by_method = k.key in set_by
    return keys


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{}" if not value else ",".join(f"{k}={v}" for k, v in value.items())
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_keys(preset: str) -> str:
    """The table ``stare-lab simulate --list-keys`` prints: key, type, the preset's value, description."""
    keys = preset_keys(preset)
    spec = get_preset(preset)
    width = max(len(k.key) for k in keys) + 2
    tw = max(len(k.type) for k in keys) + 2
    vw = min(14, max(len(_fmt(k.value)) for k in keys) + 2)
    lines = [f"override keys of preset {preset!r} ({spec['kind']}); value = the preset's; give them as KEY=VALUE "
             "(stare.* is short for loss.stare.*; loss.params.NAME=VALUE for a loss registered outside the package)",
             f"{'key':<{width}}{'type':<{tw}}{'value':<{vw}}description (allowed values)"]
    for k in keys:
        doc = k.doc + (" [set by the method: choose it with --methods]" if k.set_by_method else "")
        lines.append(f"{k.key:<{width}}{k.type:<{tw}}{_fmt(k.value):<{vw}}{doc}")
    return "\n".join(lines)
