"""The one reader of user-given files: every file a command reads (``train --train-data``, ``evaluate --file`` /
``--config``, ``promote --base`` / ``--probe``, config YAMLs, JSONL records, JSON) goes through here before use.

Each check fails with one line, ``FILE:LINE: what was wrong`` (or ``WHAT 'FILE': what was wrong`` for the whole
file), as a :class:`~stare_lab.errors.StareLabError` of the caller's choice (``DataError`` for data,
``ConfigError`` for configs) — never a ``UnicodeDecodeError`` / ``JSONDecodeError`` / YAML traceback:

* existence: a missing path, a directory where a file is expected, an unreadable file (permissions);
* size: an empty file (where content is needed), a file above ``max_bytes`` (configs: 16 MiB);
* encoding: UTF-8 only (a leading UTF-8 byte-order mark is dropped); a UTF-16/32 byte-order mark, a byte that is
  not UTF-8 or a NUL byte (a binary file) names the line and column;
* format: JSON per line (JSONL, each line a JSON object), JSON, or a YAML mapping, with the parser's line and
  column.

JSONL is streamed line by line (no size limit; memory is one line), the other formats are read whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from stare_lab.errors import ConfigError, DataError, StareLabError

__all__ = ["MAX_CONFIG_BYTES", "check_file", "read_text", "iter_lines", "iter_jsonl", "read_json", "read_yaml",
           "yaml_error_where"]

#: Largest config / JSON file read whole (bytes).
MAX_CONFIG_BYTES = 16 * 2**20

_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
         (b"\xfe\xff", "UTF-16"))


def check_file(path: str | os.PathLike, what: str = "file", error: type[StareLabError] = DataError,
               max_bytes: int | None = None, allow_empty: bool = False) -> Path:
    """``path`` as a :class:`~pathlib.Path` after checking that it is a readable regular file of an allowed size.

    Raises:
        error: missing, a directory, unreadable, empty (unless ``allow_empty``), or larger than ``max_bytes``.
    """
    p = Path(path)
    if not p.exists():
        raise error(f"{what} {str(p)!r} does not exist")
    if p.is_dir():
        raise error(f"{what} {str(p)!r} is a directory, not a file")
    try:
        size = p.stat().st_size
        with open(p, "rb"):
            pass
    except OSError as err:
        raise error(f"{what} {str(p)!r} cannot be read: {err.strerror or err}") from None
    if size == 0 and not allow_empty:
        raise error(f"{what} {str(p)!r} is empty")
    if max_bytes is not None and size > max_bytes:
        raise error(f"{what} {str(p)!r} is {size / 2**20:.1f} MiB, more than the {max_bytes / 2**20:.0f} MiB such a "
                    "file may have")
    return p


def _decode(raw: bytes, p: Path, lineno: int, error: type[StareLabError]) -> str:
    """One line's bytes as text (module docstring: UTF-8, no NUL)."""
    if lineno == 1:
        for bom, name in _BOMS:
            if raw.startswith(bom):
                raise error(f"{p}:1: {name} text (byte-order mark {raw[:len(bom)].hex(' ')}); save the file as UTF-8")
        if raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise error(f"{p}:{lineno}: a NUL byte at column {nul + 1}: a binary file, not UTF-8 text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        column = len(raw[:err.start].decode("utf-8", errors="replace")) + 1
        raise error(f"{p}:{lineno}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {column}); save the "
                    "file as UTF-8") from None


def iter_lines(path: str | os.PathLike, what: str = "file", error: type[StareLabError] = DataError,
               allow_empty: bool = False) -> Iterator[tuple[int, str]]:
    """``(line number from 1, line without its newline)`` of a UTF-8 text file, streamed.

    Raises:
        error: as :func:`check_file`, or a line that is not UTF-8 (module docstring).
    """
    p = check_file(path, what, error, allow_empty=allow_empty)
    with open(p, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            yield lineno, _decode(raw, p, lineno, error).rstrip("\r\n")


def read_text(path: str | os.PathLike, what: str = "file", error: type[StareLabError] = DataError,
              max_bytes: int | None = MAX_CONFIG_BYTES, allow_empty: bool = False) -> str:
    """The whole text of a UTF-8 file (size at most ``max_bytes``).

    Raises:
        error: as :func:`check_file` and :func:`iter_lines`.
    """
    p = check_file(path, what, error, max_bytes=max_bytes, allow_empty=allow_empty)
    with open(p, "rb") as fh:
        return "".join(_decode(raw, p, n, error) for n, raw in enumerate(fh, 1))


def iter_jsonl(path: str | os.PathLike, what: str = "file",
               error: type[StareLabError] = DataError) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of a JSONL file: each non-blank line one JSON object.

    Raises:
        error: as :func:`iter_lines`; a line that is not valid JSON (naming line and column) or not an object; a
            file without any record.
    """
    n = 0
    for lineno, line in iter_lines(path, what, error):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{path}:{lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(rec, dict):
            raise error(f"{path}:{lineno}: a record must be a JSON object, got {type(rec).__name__}")
        n += 1
        yield lineno, rec
    if n == 0:
        raise error(f"{what} {str(path)!r} holds no record (only blank lines)")


def read_json(path: str | os.PathLike, what: str = "file", error: type[StareLabError] = DataError,
              max_bytes: int | None = MAX_CONFIG_BYTES) -> Any:
    """A JSON document.

    Raises:
        error: as :func:`read_text`, or not valid JSON (naming line and column).
    """
    text = read_text(path, what, error, max_bytes)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None


def read_yaml(path: str | os.PathLike, what: str = "config file", error: type[StareLabError] = ConfigError,
              max_bytes: int | None = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A YAML mapping (an empty file is ``{}``).

    Raises:
        error: as :func:`read_text`; not valid YAML (naming line and column); not a mapping at top level.
    """
    try:
        import yaml
    except ImportError as err:  # pragma: no cover - PyYAML is a dependency
        raise error("reading YAML needs PyYAML: pip install pyyaml") from err
    text = read_text(path, what, error, max_bytes, allow_empty=True)
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        line, column, problem = yaml_error_where(err)
        col = f" at column {column}" if column is not None else ""
        raise error(f"{path}:{line or '?'}: not valid YAML ({problem}{col})") from None
    except yaml.YAMLError as err:
        raise error(f"{what} {str(path)!r} is not valid YAML: {' '.join(str(err).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{what} {str(path)!r} must hold a mapping at top level, got {type(data).__name__}")
    return data


def yaml_error_where(err: Any) -> tuple[int | None, int | None, str]:
    """``(line, column, problem)`` of a PyYAML ``MarkedYAMLError`` (1-based; None without a mark), for one-line
    messages (PyYAML's own spans several lines and names ``"<unicode string>"``)."""
    mark = err.problem_mark or err.context_mark
    problem = " ".join(str(x) for x in (err.context, err.problem) if x)
    return (None, None, problem) if mark is None else (mark.line + 1, mark.column + 1, problem)
