"""stare_lab.platform.plugins: a plugin by file path or module name is imported once per process; entry points of group
``stare_lab.plugins`` are loaded (a function is called once); every failure is one PluginError line naming the plugin;
a plugin loss that raises or returns NaN is one CLI line naming the loss. The plugins here only append their name to
a list of a helper module, to count their imports."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest

from stare_lab.platform import plugins
from stare_lab.errors import ConfigError
from stare_lab.platform.plugins import PluginError, load_plugin, load_plugins, loaded_plugins

COUNT = "import tests_plugin_counter as c\nc.imports.append(__name__)\n"


@pytest.fixture
def counter(tmp_path, monkeypatch):
    """A module ``tests_plugin_counter`` with a list ``imports`` that each plugin appends its name to; a fresh
    registry of loaded plugins."""
    (tmp_path / "tests_plugin_counter.py").write_text("imports = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", True)  # no installed entry points unless a test asks
    import tests_plugin_counter

    yield tests_plugin_counter
    for name in [m for m in sys.modules if m.startswith(("tests_plugin_", "stare_lab_plugin_tp_"))]:
        del sys.modules[name]


def test_a_file_and_a_module_are_imported_once(tmp_path, counter):
    (tmp_path / "tp_file.py").write_text(COUNT)
    (tmp_path / "tests_plugin_mod.py").write_text(COUNT)
    mod = load_plugin(str(tmp_path / "tp_file.py"))
    assert mod.__name__ == "stare_lab_plugin_tp_file" and load_plugin(str(tmp_path / "tp_file.py")) is mod
    assert load_plugins([str(tmp_path / "tp_file.py"), "tests_plugin_mod", "tests_plugin_mod"]) == [
        str(tmp_path / "tp_file.py"), "tests_plugin_mod"]
    assert counter.imports == ["stare_lab_plugin_tp_file", "tests_plugin_mod"]
    assert loaded_plugins() == [str(tmp_path / "tp_file.py"), "tests_plugin_mod"]


def test_failures_are_one_line_naming_the_plugin(tmp_path, counter):
    (tmp_path / "tp_bad.py").write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(PluginError) as err:
        load_plugin(str(tmp_path / "tp_bad.py"))
    assert str(err.value) == f"plugin {str(tmp_path / 'tp_bad.py')!r} failed to import: RuntimeError: no GPU here"
    assert "stare_lab_plugin_tp_bad" not in sys.modules  # a failed file import leaves nothing behind
    with pytest.raises(PluginError, match=r"plugin 'tests_plugin_nope' failed to import: ModuleNotFoundError"):
        load_plugin("tests_plugin_nope")
    with pytest.raises(PluginError, match="no such file"):
        load_plugin(str(tmp_path / "missing.py"))
    with pytest.raises(PluginError, match="must be a list"):
        load_plugins("tests_plugin_mod")
    with pytest.raises(PluginError, match="must be a module name"):
        load_plugin(" ")
    other = tmp_path / "elsewhere"
    other.mkdir()
    (tmp_path / "tp_same.py").write_text(COUNT)
    (other / "tp_same.py").write_text(COUNT)
    load_plugin(str(tmp_path / "tp_same.py"))
    with pytest.raises(PluginError, match="already taken"):
        load_plugin(str(other / "tp_same.py"))
    assert issubclass(PluginError, ConfigError)  # the CLI prints it as one line


def test_entry_points_are_loaded_once(tmp_path, counter, monkeypatch):
    (tmp_path / "tests_plugin_ep.py").write_text(COUNT + "def register():\n    c.imports.append('register')\n")
    eps = [metadata.EntryPoint(name="mod", value="tests_plugin_ep", group=plugins.ENTRY_POINT_GROUP),
           metadata.EntryPoint(name="fn", value="tests_plugin_ep:register", group=plugins.ENTRY_POINT_GROUP)]
    seen = []
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: seen.append(group) or eps)
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", False)
    load_plugins()
    load_plugins()
    assert seen == [plugins.ENTRY_POINT_GROUP]  # read once per process
    assert counter.imports == ["tests_plugin_ep", "register"]  # sorted by name: fn (calls register) needs the import
    bad = [metadata.EntryPoint(name="bad", value="tests_plugin_missing", group=plugins.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: bad)
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", False)
    with pytest.raises(PluginError, match=r"plugin 'bad = tests_plugin_missing' \(entry point of group "
                                          r"stare_lab.plugins\) failed to load: ModuleNotFoundError"):
        load_plugins()


LOSS_PLUGIN = ("import torch\nfrom stare_lab.loss.losses import register_policy_loss\n"
               "from stare_lab.loss.methods import register_method\n\n"
               "@register_policy_loss('bad')\ndef bad(ctx, cfg):\n    {body}\n\nregister_method('bad', 'bad')\n")


@pytest.mark.parametrize("body, message", [
    ("raise ValueError('plugin bug')", "policy loss 'bad' raised ValueError: plugin bug"),
    ("return torch.full_like(ctx.ratio, float('nan')), {}", "policy loss 'bad' returned a non-finite value (nan)"),
])
@pytest.mark.parametrize("methods", ["bad", "grpo,bad"])
def test_a_plugin_loss_that_fails_is_one_cli_line(tmp_path, body, message, methods):
    """``simulate`` with a plugin loss that raises or returns NaN: exit 1 and one stderr line naming the loss, in
    one process and with the runs spread over two worker processes (the worker's error crosses to the parent as
    it is)."""
    import subprocess

    (tmp_path / "bad.py").write_text(LOSS_PLUGIN.format(body=body))
    argv = ["--plugin", str(tmp_path / "bad.py"), "simulate", "--preset", "collapse", "--seeds", "2", "--steps", "2",
            "--no-plots", "--out", str(tmp_path / "run"), "--methods", methods, "--workers", "2"]
    proc = subprocess.run([sys.executable, "-m", "stare_lab.cli", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"stare-lab simulate: error: {message}"), proc.stderr
