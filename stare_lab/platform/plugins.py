"""Plugins: user modules that register losses, methods, global statistics (and anything else with a registry)
before a command runs — without editing the project (docs/extending.md).

A plugin is an ordinary Python module whose import registers things (``register_policy_loss``, ``register_method``,
``register_global_stat``). It is named in one of three ways, all loaded by :func:`load_plugins`:

* ``stare-lab --plugin NAME`` (repeatable) — for every subcommand, before it runs;
* the trainer config's ``plugins:`` list — imported by every process that loads the config (each torchrun rank);
* the entry-point group ``stare_lab.plugins`` of an installed package — loaded by every :func:`load_plugins` call
  (once per process). An entry point names a module (imported) or a function without arguments (called once).

``NAME`` is a module name importable from ``sys.path`` (``my_pkg.my_loss``), or a path to a ``.py`` file
(``./my_loss.py``, anything ending in ``.py``), imported under the module name ``stare_lab_plugin_<stem>``. Loading is
idempotent per process: a plugin named twice (on the command line and in the config, say) is imported once. Forked
worker processes (the tabular simulator's) inherit what the parent loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Iterable

from stare_lab.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ENTRY_POINT_GROUP", "load_plugin", "load_plugins", "loaded_plugins", "PluginError"]

#: The entry-point group of installed plugins.
ENTRY_POINT_GROUP = "stare_lab.plugins"

#: plugin name as given → module, in load order
_LOADED: dict[str, ModuleType | None] = {}
_ENTRY_POINTS_LOADED = False


class PluginError(ConfigError):
    """A plugin could not be loaded: the message names it and the error its import raised."""


def _is_path(name: str) -> bool:
    return name.endswith(".py") or "/" in name or "\\" in name


def _module_name_for(path: Path) -> str:
    stem = re.sub(r"\W", "_", path.stem)
    return f"stare_lab_plugin_{stem}"


def load_plugin(name: str) -> ModuleType:
    """Import the plugin ``name`` (a module name or a path to a ``.py`` file); a second call returns the module of
    the first.

    Raises:
        PluginError: an empty name, a missing file, a file whose module name is taken by another file, or any
            exception raised while importing (one line: the plugin, the exception type and its message).
    """
    if not isinstance(name, str) or not name.strip():
        raise PluginError(f"plugin name {name!r} must be a module name or a path to a .py file")
    name = name.strip()
    module = _LOADED.get(name)
    if module is not None:
        return module
    try:
        module = _import_file(name) if _is_path(name) else importlib.import_module(name)
    except PluginError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of user code is reported as one line
        raise PluginError(f"plugin {name!r} failed to import: {type(err).__name__}: {err}") from None
    _LOADED[name] = module
    logger.debug("loaded plugin %s (%s)", name, getattr(module, "__file__", "?"))
    return module


def _import_file(name: str) -> ModuleType:
    path = Path(name).expanduser().resolve()
    if not path.is_file():
        raise PluginError(f"plugin {name!r}: no such file ({path})")
    if path.suffix != ".py":
        raise PluginError(f"plugin {name!r}: a plugin file must end in .py")
    mod_name = _module_name_for(path)
    existing = sys.modules.get(mod_name)
    if existing is not None:
        if Path(getattr(existing, "__file__", "") or "").resolve() == path:
            return existing
        raise PluginError(f"plugin {name!r}: module name {mod_name!r} is already taken by "
                          f"{getattr(existing, '__file__', '?')}; rename one of the files")
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a source loader
        raise PluginError(f"plugin {name!r}: cannot be imported from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as err:  # noqa: BLE001 - broken metadata of some other package
        logger.warning("cannot read the %s entry points: %s", ENTRY_POINT_GROUP, err)
        return
    for ep in sorted(eps, key=lambda e: e.name):
        label = f"{ep.name} = {ep.value}"
        if label in _LOADED:
            continue
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, ModuleType):
                obj()
        except Exception as err:  # noqa: BLE001 - see load_plugin
            raise PluginError(f"plugin {label!r} (entry point of group {ENTRY_POINT_GROUP}) failed to load: "
                              f"{type(err).__name__}: {err}") from None
        _LOADED[label] = obj if isinstance(obj, ModuleType) else None
        logger.debug("loaded plugin entry point %s", label)


def load_plugins(names: Iterable[str] = (), *, entry_points: bool = True) -> list[str]:
    """Load the installed entry-point plugins (first call only, unless ``entry_points=False``), then each of
    ``names`` in order (:func:`load_plugin`).

    Returns:
        The names of every plugin loaded in this process so far, in load order (:func:`loaded_plugins`).

    Raises:
        PluginError: the first plugin that fails (nothing after it is loaded); ``names`` not a list of strings.
    """
    if isinstance(names, str):
        raise PluginError(f"plugins={names!r} must be a list of module names or .py paths, not one string")
    names = list(names)
    if entry_points:
        _load_entry_points()
    for name in names:
        load_plugin(name)
    return loaded_plugins()


def loaded_plugins() -> list[str]:
    """The plugins loaded in this process so far (names as given; entry points as ``name = value``)."""
    return list(_LOADED)
