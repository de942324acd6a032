"""The front door: an unknown option prints the usage of the subcommand it was given to (not the top-level one)."""

from __future__ import annotations

import pytest

from stare_lab.cli import main


@pytest.mark.parametrize("argv, prog", [
    (["simulate", "--bogus"], "stare-lab simulate"),
    (["analyze", "runs", "--bogus"], "stare-lab analyze"),
    (["train", "cfg.yaml", "--bogus"], "stare-lab train"),
    (["evaluate", "--model", "m", "--bogus"], "stare-lab evaluate"),
])
def test_unknown_option_prints_the_subcommands_usage(argv, prog, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} ")
    assert err.strip().splitlines()[-1] == f"{prog}: error: unrecognized arguments: --bogus"


def test_unknown_option_without_a_subcommand_prints_the_top_level_usage(capsys):
    with pytest.raises(SystemExit):
        main(["--bogus"])
    err = capsys.readouterr().err
    assert err.startswith("usage: stare-lab ") and "stare-lab: error: unrecognized arguments: --bogus" in err


def test_overrides_after_options_still_reach_the_command(tmp_path, capsys):
    """key=value words after a command's options are overrides (the ``extra_overrides`` convention), not errors."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rollout:\n  n: 4\n")
    assert main(["train", str(cfg), "--out", str(tmp_path / "o"), "rollout.n=1"]) == 1  # reached the config check
    assert "rollout.n=1 is below 2" in capsys.readouterr().err
