"""The one reader of user files (stare_lab.platform.files) and the commands that read through it: every bad file is one line
naming the file, the line and what was wrong — never a UnicodeDecodeError / JSONDecodeError / YAML traceback.

The expected line and column numbers are those of the bad byte written by each test (counted by hand)."""

from __future__ import annotations

import json

import pytest
import yaml

from stare_lab.cli import main as cli_main
from stare_lab.errors import ConfigError, DataError
from stare_lab.platform.files import iter_jsonl, read_json, read_text, read_yaml

GOOD = json.dumps({"problem": "1+1?", "answer": "2"})


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_non_utf8_names_line_and_column(tmp_path):
    """Line 2 holds 'ab' then byte 0xff: line 2, column 3."""
    p = tmp_path / "d.jsonl"
    p.write_bytes(GOOD.encode() + b"\nab\xff\n")
    with pytest.raises(DataError, match=r"d\.jsonl:2: not UTF-8 text \(byte 0xff at column 3\)"):
        list(iter_jsonl(p, "data file"))


def test_multibyte_characters_count_as_one_column(tmp_path):
    """'é' is two bytes in UTF-8 but one column: the bad byte after 'é' is at column 2."""
    p = tmp_path / "c.yaml"
    p.write_bytes("é".encode() + b"\x80\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:1: not UTF-8 text \(byte 0x80 at column 2\)"):
        read_yaml(p)


def test_utf16_binary_empty_directory_missing(tmp_path):
    u16 = tmp_path / "u16.jsonl"
    u16.write_bytes(GOOD.encode("utf-16"))
    with pytest.raises(DataError, match=r"u16\.jsonl:1: UTF-16 text \(byte-order mark ff fe\); save the file as UTF-8"):
        list(iter_jsonl(u16))
    binary = tmp_path / "b.json"
    binary.write_bytes(b'{"a":\n 1\x00}')
    with pytest.raises(DataError, match=r"b\.json:2: a NUL byte at column 3: a binary file"):
        read_json(binary)
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=r"file '.*e\.jsonl' is empty"):
        list(iter_jsonl(empty))
    with pytest.raises(DataError, match="is a directory, not a file"):
        read_text(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        read_text(tmp_path / "nope")


def test_size_limit(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_bytes(b"a: 1\n" * 1000)
    with pytest.raises(ConfigError, match=r"big\.yaml' is 0\.0 MiB, more than the 0 MiB"):
        read_yaml(p, max_bytes=100)


def test_bom_is_dropped_and_formats_parse(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n\n" + GOOD.encode() + b"\r\n")
    assert [n for n, _ in iter_jsonl(p)] == [1, 3]
    y = tmp_path / "c.yaml"
    y.write_text("a:\n  b: [1, 2\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:3: not valid YAML \(.*\)"):
        read_yaml(y)
    y.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must hold a mapping at top level, got list"):
        read_yaml(y)
    j = tmp_path / "x.jsonl"
    j.write_text(GOOD + "\n[1]\n")
    with pytest.raises(DataError, match=r"x\.jsonl:2: a record must be a JSON object, got list"):
        list(iter_jsonl(j))


# ------------------------------------------------------------------------------------------------ the commands


def test_train_data_not_utf8(tmp_path, capsys):
    """`train --preset tiny-cpu --train-data F` with a Latin-1 byte on line 2: one line, nothing created."""
    data = tmp_path / "d.jsonl"
    data.write_bytes(GOOD.encode() + b'\n{"problem": "caf\xe9", "answer": "1"}\n')
    out = tmp_path / "run"
    assert cli_main(["train", "--preset", "tiny-cpu", "--train-data", str(data), "--out", str(out)]) == 1
    err = _one_line(capsys)
    assert err == f"stare-lab train: error: {data}:2: not UTF-8 text (byte 0xe9 at column 17); save the file as UTF-8"
    assert not out.exists()


def test_evaluate_file_not_utf8(tmp_path, capsys):
    bad = tmp_path / "mine.jsonl"
    bad.write_bytes(b"\xfe\n")
    rc = cli_main(["evaluate", "--model", str(tmp_path), "--benchmarks", "mine", "--file", f"mine={bad}",
                   "--out", str(tmp_path / "ev")])
    assert rc == 1
    assert _one_line(capsys) == (f"stare-lab evaluate: error: {bad}:1: not UTF-8 text (byte 0xfe at column 1); "
                                 "save the file as UTF-8")
    assert not (tmp_path / "ev").exists()


def test_evaluate_config_not_utf8(tmp_path, capsys):
    cfg = tmp_path / "e.yaml"
    cfg.write_bytes(b"n: 4\nlimit: \xff\n")
    rc = cli_main(["evaluate", "--model", str(tmp_path), "--config", str(cfg), "--out", str(tmp_path / "ev")])
    assert rc == 1 and _one_line(capsys).endswith(f"{cfg}:2: not UTF-8 text (byte 0xff at column 8); save the file "
                                                  "as UTF-8")


def test_promote_base_not_utf8(tmp_path, capsys):
    run = tmp_path / "sweep" / "c2" / "seed0"
    run.mkdir(parents=True)
    base = tmp_path / "base.yaml"
    base.write_bytes(b"method: grpo\nmodel: {path: m\xe4}\n")
    rc = cli_main(["promote", str(tmp_path / "sweep"), "--method", "c2", "--base", str(base), "--out",
                   str(tmp_path / "o.yaml")])
    assert rc == 1
    assert _one_line(capsys) == (f"stare-lab promote: error: {base}:2: not UTF-8 text (byte 0xe4 at column 16); "
                                 "save the file as UTF-8")


def test_train_config_not_utf8_and_bad_yaml(tmp_path, capsys):
    cfg = tmp_path / "t.yaml"
    cfg.write_bytes(b"seed: 1\nmethod: c\xf62\n")
    assert cli_main(["train", str(cfg)]) == 1
    assert _one_line(capsys) == (f"stare-lab train: error: {cfg}:2: not UTF-8 text (byte 0xf6 at column 10); save "
                                 "the file as UTF-8")
    cfg.write_text(yaml.safe_dump({"seed": 1}) + "optim: {lr: 1e-6\n")
    assert cli_main(["train", str(cfg)]) == 1
    assert f"{cfg}:3: not valid YAML" in _one_line(capsys)


def test_paper_table_and_deepspeed_json_not_utf8(tmp_path):
    """The analysis paper table (--paper CSV) and deepspeed.config_file go through the same reader."""
    from analysis.paper import load_paper_table
    from trainer.config import load_trainer_config
    from trainer.engines.launch import deepspeed_json

    csv = tmp_path / "t.csv"
    csv.write_bytes(b"setting,model,method\nshort_cot,Qw\xe9n,grpo\n")
    with pytest.raises(DataError, match=r"t\.csv:2: not UTF-8 text \(byte 0xe9 at column 13\)"):
        load_paper_table(csv)
    ds = tmp_path / "ds.json"
    ds.write_bytes(b'{"zero_optimization":\n {"stage": 2, "x": "\xff"}}\n')
    cfg = load_trainer_config(None, [f"deepspeed.config_file={ds}"])
    with pytest.raises(ConfigError, match=r"ds\.json:2: not UTF-8 text \(byte 0xff at column 21\)"):
        deepspeed_json(cfg, 1)
