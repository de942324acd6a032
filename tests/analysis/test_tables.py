"""The report's table model (analysis.tables): one table, rendered to Markdown, HTML and JSON, says the same thing in
all three. Expected cells are written out by hand from the rules in the docstrings."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser

import pytest

from analysis.document import Doc
from analysis.tables import Column, Table, interval

T975_3 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom (3 seeds)


class _Cells(HTMLParser):
    """The text of every <th>/<td> of an HTML table, row by row, and the class of each <td>."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.classes: list[list[str | None]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
            self.classes.append([])
        elif tag in ("td", "th"):
            self._cell = []
            self.classes[-1].append(dict(attrs).get("class"))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _table() -> Table:
    """Two groups: a seed aggregate of a fraction (cut to [0, 1] for o1), an entropy, a JSON-only column, a
    display-only column, a formatted list and a missing value."""
    t = Table([
        Column("group", "group"),
        Column("method"),  # JSON only
        Column("seeds", "seeds", text=lambda s: ", ".join(map(str, s))),
        Column("steps", "steps", in_json=False),  # text only
        interval("frac_in_band", "in band (fraction of steps)"),
        Column("target_entropy", "target H", "nats"),
        Column("rmse", "RMSE (pooled)", "nats"),
    ])
    # o1: 3 seeds in band 1, 0, 0 → mean 1/3, s = 0.5774, half-width 4.3027·0.5774/√3 = 1.434 → cut to [0, 1]
    t.add(group="o1 (W=1.3)", method="o1", seeds=[0, 1, 2], steps="300", frac_in_band=(1 / 3, T975_3 * math.sqrt(1 / 3)
          / math.sqrt(3), 3), target_entropy=0.4, rmse=0.0012345)
    t.add(group="grpo | base", method="grpo", seeds=[0], steps="280–300", frac_in_band=(0.05, 0.01, 3),
          target_entropy=None, rmse=float("nan"))
    return t


def test_one_table_reads_the_same_in_markdown_html_and_json():
    t = _table()
    header = ["group", "seeds", "steps", "in band (fraction of steps)", "target H (nats)", "RMSE (pooled, nats)"]
    # by hand: 3 significant digits; a cut interval as [low, high] with 2 digits; ± with 2 digits; None/NaN empty
    cells = [["o1 (W=1.3)", "0, 1, 2", "300", "0.333 [0, 1]", "0.4", "0.00123"],
             ["grpo | base", "0", "280–300", "0.05 ± 0.01", "", ""]]
    assert t.header() == header and t.cells() == cells

    md = t.to_markdown().splitlines()
    assert md[0] == "| " + " | ".join(header) + " |" and md[1] == "|---|---|---|---|---|---|"
    assert md[2] == "| o1 (W=1.3) | 0, 1, 2 | 300 | 0.333 [0, 1] | 0.4 | 0.00123 |"
    assert md[3] == "| grpo \\| base | 0 | 280–300 | 0.05 ± 0.01 |  |  |"  # '|' in a cell escaped

    parser = _Cells()
    parser.feed(t.to_html())
    assert parser.rows == [header, *cells]
    assert parser.classes[1] == [None, None, "n", "n", "n", "n"]  # numbers right-aligned ("300" too), text not

    rows = json.loads(json.dumps(t.to_json(), allow_nan=False))
    assert [list(r) for r in rows] == [["group", "method", "seeds", "frac_in_band", "target_entropy", "rmse"]] * 2
    o1, grpo = rows
    assert o1["method"] == "o1" and o1["seeds"] == [0, 1, 2] and o1["target_entropy"] == 0.4
    band = o1["frac_in_band"]
    assert band["mean"] == pytest.approx(1 / 3) and band["n"] == 3 and (band["low"], band["high"]) == (0.0, 1.0)
    assert band["ci95"] == pytest.approx(1.434, abs=5e-4)
    assert grpo["frac_in_band"] == {"mean": 0.05, "ci95": 0.01, "n": 3, "low": pytest.approx(0.04),
                                    "high": pytest.approx(0.06)}
    assert grpo["target_entropy"] is None and grpo["rmse"] is None  # NaN → null, never NaN in JSON


def test_a_doc_renders_the_table_with_its_notes_before_it():
    """The notes of a table come first (a list), in Markdown and HTML; to_json_matrix keeps header, rows, notes."""
    t = Table.from_rows(["method", "aime24"], [["STARE-O1", 44.2], ["GRPO", None]], notes=["reported, `rerun`"])
    doc = Doc()
    doc.table(t)
    assert doc.to_markdown() == ("- reported, `rerun`\n\n| method | aime24 |\n|---|---|\n| STARE-O1 | 44.2 |\n"
                                 "| GRPO |  |\n")
    page = doc.to_html({}, "t")
    assert page.index("<li>reported, <code>rerun</code></li>") < page.index("<table>")
    assert t.to_json_matrix() == {"header": ["method", "aime24"], "rows": [["STARE-O1", 44.2], ["GRPO", None]],
                                  "notes": ["reported, `rerun`"]}
