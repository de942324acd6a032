"""One table model for the report: a :class:`Table` (columns with titles and units, rows of raw values, notes) is
built once and rendered three ways — Markdown (:meth:`Table.to_markdown`), HTML (:meth:`Table.to_html`) and JSON
(:meth:`Table.to_json`, :meth:`Table.to_json_matrix`) — so ``report.md``, ``report.html`` and ``report.json`` show
the same numbers.

A row holds raw values (numbers, seed aggregates ``(mean, half-width, n)``, lists); each :class:`Column` says how its
value reads as a cell (``text``) and as JSON (``json``), and whether it appears in the text tables (a ``title``),
in JSON (``in_json``) or both. Seed aggregates are :func:`interval` columns: ``0.123 ± 0.004`` in a cell (the
interval cut to the statistic's possible values, :func:`analysis.stats.known_range`), ``{"mean", "ci95", "n",
"low", "high"}`` in JSON.
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
from typing import Any, Callable, Sequence

from . import stats

__all__ = ["Column", "Table", "interval", "cell_text", "json_value", "interval_text", "interval_json",
           "inline_html"]

#: a cell that reads as a number (right-aligned in HTML): ``0.12``, ``0.12 ± 0.01``, ``0.5 [0, 1]``, ``3 (2/3)``
_NUMERIC = re.compile(r"^-?[\d.]+(e-?\d+)?( ± [\d.]+(e-?\d+)?| \[-?[\d.]+(e-?\d+)?, (-?[\d.]+(e-?\d+)?|inf)\])?"
                      r"( \(\d+/\d+\))?$")


def cell_text(v: Any, digits: int = 3) -> str:
    """A table cell: '' for None/NaN/±inf, ints and strings as they are, floats with ``digits`` significant digits
    (below 10^digits; larger floats without decimals)."""
    if v is None:
        return ""
    if isinstance(v, (bool, int, str)):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return ""
        return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"
    return str(v)


def json_value(v: Any) -> Any:
    """A value for JSON: None for None/NaN/±inf, ints as ints, other numbers as floats, strings and booleans as they
    are, lists/tuples and dicts element by element (keys as strings)."""
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    if isinstance(v, float) or hasattr(v, "__float__"):
        v = float(v)
        return v if math.isfinite(v) else None
    return v


def interval_text(t: tuple[float, float, int] | None, key: str = "", digits: int = 3) -> str:
    """A seed aggregate ``(mean, half-width, n)`` as a cell: '0.123 ± 0.004' (no ± for one value; '' for none);
    where the interval leaves the possible values of statistic ``key`` (:func:`analysis.stats.known_range`) the
    cut interval instead: '0.577 [0, 1]'."""
    if not t or t[2] == 0:
        return ""
    mean, hw, _ = t
    lo, hi, cut = stats.clipped_interval(mean, hw, stats.known_range(key))
    if cut:
        return f"{cell_text(mean, digits)} [{cell_text(lo, 2)}, {cell_text(hi, 2)}]"
    return cell_text(mean, digits) + (f" ± {cell_text(hw, 2)}" if math.isfinite(hw) else "")


def interval_json(t: tuple[float, float, int] | None, key: str = "") -> dict[str, Any] | None:
    """A seed aggregate ``(mean, half-width, n)`` for JSON: ``{"mean", "ci95", "n", "low", "high"}`` — ``ci95`` the
    t half-width, ``low`` / ``high`` the interval cut to the possible values of statistic ``key`` (as the cell shows
    it); None entries where undefined, None for no aggregate."""
    if t is None:
        return None
    lo, hi, _ = stats.clipped_interval(t[0], t[1], stats.known_range(key)) if t[2] else (math.nan, math.nan, False)
    return {"mean": json_value(t[0]), "ci95": json_value(t[1]), "n": int(t[2]), "low": json_value(lo),
            "high": json_value(hi)}


def inline_html(text: str) -> str:
    """Escape ``text`` for HTML, with `backticks` as ``<code>`` and **stars** as ``<strong>``."""
    parts = re.split(r"(`[^`]*`|\*\*[^*]+\*\*)", text)
    return "".join(
        f"<code>{html.escape(p[1:-1])}</code>" if p.startswith("`") and p.endswith("`") and len(p) > 1
        else f"<strong>{html.escape(p[2:-2])}</strong>" if p.startswith("**") and p.endswith("**") and len(p) > 4
        else html.escape(p)
        for p in parts
    )


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a :class:`Table`.

    Attributes:
        key: the row's key of the value, and its key in JSON.
        title: the header in Markdown and HTML; None for a column that only goes into JSON.
        unit: joined into the header: ``"RMSE"`` + ``"nats"`` → ``RMSE (nats)``, ``"initial H (first logged)"`` +
            ``"nats"`` → ``initial H (first logged, nats)``.
        text: the value → the cell's text (default :func:`cell_text`).
        json: the value → its JSON value (default :func:`json_value`).
        in_json: whether :meth:`Table.to_json` writes the column.
    """

    key: str
    title: str | None = None
    unit: str = ""
    text: Callable[[Any], str] = cell_text
    json: Callable[[Any], Any] = json_value
    in_json: bool = True

    @property
    def header(self) -> str:
        """The column's header: its title with the unit joined in."""
        title = self.title or ""
        if not self.unit:
            return title
        if title.endswith(")"):
            return f"{title[:-1]}, {self.unit})"
        return f"{title} ({self.unit})"


def interval(key: str, title: str | None, unit: str = "", stat: str | None = None) -> Column:
    """A column of seed aggregates ``(mean, half-width, n)``: :func:`interval_text` / :func:`interval_json` for the
    statistic ``stat`` (default ``key``; :func:`analysis.stats.known_range` reads its possible values from it)."""
    s = key if stat is None else stat
    return Column(key, title, unit, text=lambda t: interval_text(t, s), json=lambda t: interval_json(t, s))


@dataclasses.dataclass
class Table:
    """Columns, rows of raw values (dicts by column key; a missing key is None) and notes (shown as a list before
    the table, written into :meth:`to_json_matrix`)."""

    columns: Sequence[Column]
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_rows(cls, header: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()) -> Table:
        """A table of plain columns from a header and rows of values (keys ``c0``, ``c1``, …; the header strings as
        titles), for tables that only the text shows or that go into JSON as a matrix."""
        cols = [Column(f"c{i}", h) for i, h in enumerate(header)]
        return cls(cols, [{c.key: v for c, v in zip(cols, r)} for r in rows], list(notes))

    def add(self, **values: Any) -> None:
        """Append a row (values by column key)."""
        self.rows.append(values)

    def _shown(self) -> list[Column]:
        return [c for c in self.columns if c.title is not None]

    def header(self) -> list[str]:
        """The headers of the shown columns."""
        return [c.header for c in self._shown()]

    def cells(self) -> list[list[str]]:
        """The text of every shown cell, row by row."""
        cols = self._shown()
        return [[c.text(r.get(c.key)) for c in cols] for r in self.rows]

    def to_markdown(self) -> str:
        """GitHub-flavoured Markdown: the notes as a list, then the table ('|' in cells escaped)."""
        esc = [[c.replace("|", "\\|") for c in r] for r in [self.header(), *self.cells()]]
        lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(esc[0])]
        lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
        notes = "\n".join(f"- {n}" for n in self.notes)
        return (notes + "\n\n" if notes else "") + "\n".join(lines)

    def to_html(self) -> str:
        """An HTML ``<table>`` (after a ``<ul>`` of the notes); cells that read as numbers get class ``n``
        (right-aligned by the report's style)."""
        head = "".join(f"<th>{inline_html(c)}</th>" for c in self.header())
        rows = "".join(
            "<tr>" + "".join(
                f'<td class="n">{inline_html(c)}</td>' if _NUMERIC.match(c) else f"<td>{inline_html(c)}</td>"
                for c in r
            ) + "</tr>"
            for r in self.cells()
        )
        notes = "<ul>" + "".join(f"<li>{inline_html(n)}</li>" for n in self.notes) + "</ul>\n" if self.notes else ""
        return f"{notes}<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"

    def to_json(self) -> list[dict[str, Any]]:
        """One JSON object per row: every ``in_json`` column by its key, through the column's ``json``."""
        cols = [c for c in self.columns if c.in_json]
        return [{c.key: c.json(r.get(c.key)) for c in cols} for r in self.rows]

    def to_json_matrix(self) -> dict[str, Any]:
        """``{"header", "rows", "notes"}``: the headers, each row's values as a list (through each column's
        ``json``), the notes — for tables whose columns are data, not fields (the paper comparison)."""
        cols = self._shown()
        return {"header": self.header(), "rows": [[c.json(r.get(c.key)) for c in cols] for r in self.rows],
                "notes": list(self.notes)}
