"""The report's document model: :class:`Doc` (headings, paragraphs, lists, tables, images) renders to Markdown and
to self-contained HTML, so ``report.md`` and ``report.html`` always say the same thing. Tables are
:class:`analysis.tables.Table` (the same rows also give ``report.json``)."""

from __future__ import annotations

import base64
import html
from typing import Sequence

from .tables import Table, inline_html

__all__ = ["Doc"]

_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}"
    "td.n{text-align:right}img{max-width:100%;height:auto}code{background:#f3f3f3}"
)


class Doc:
    """A small document: add blocks, then render with :meth:`to_markdown` or :meth:`to_html`."""

    def __init__(self) -> None:
        self.blocks: list[tuple] = []

    def h(self, level: int, text: str) -> None:
        """A heading of ``level`` 1–6."""
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        """A paragraph; `backticks` become code, **stars** bold."""
        self.blocks.append(("p", text))

    def ul(self, items: Sequence[str]) -> None:
        """A bullet list (nothing for an empty list)."""
        if items:
            self.blocks.append(("ul", list(items)))

    def table(self, table: Table) -> None:
        """A table (its notes as a list before it)."""
        self.blocks.append(("table", table))

    def img(self, name: str, alt: str) -> None:
        """An image file ``name`` relative to the report's folder (Markdown: an image, or a plain link for a PDF,
        which Markdown viewers cannot show inline)."""
        self.blocks.append(("img", name, alt))

    def to_markdown(self) -> str:
        """GitHub-flavoured Markdown; images are links relative to the report's folder."""
        out: list[str] = []
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                out.append("#" * b[1] + " " + b[2])
            elif kind == "p":
                out.append(b[1])
            elif kind == "ul":
                out.append("\n".join(f"- {i}" for i in b[1]))
            elif kind == "table":
                out.append(b[1].to_markdown())
            elif kind == "img":
                out.append(f"[{b[2]} ({b[1]})]({b[1]})" if b[1].lower().endswith(".pdf") else f"![{b[2]}]({b[1]})")
        return "\n\n".join(out) + "\n"

    def to_html(self, images: dict[str, tuple], title: str) -> str:
        """HTML with every image embedded: ``images`` maps an image name to ``(mime type, bytes)`` or ``(mime type,
        bytes, width)`` — ``width`` the CSS pixels to show it at (a PNG rendered at more than 96 dpi shows at its
        figure's size in inches, sharp on high-density screens), None for its own size."""
        body: list[str] = []
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                body.append(f"<h{b[1]}>{inline_html(b[2])}</h{b[1]}>")
            elif kind == "p":
                body.append(f"<p>{inline_html(b[1])}</p>")
            elif kind == "ul":
                body.append("<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in b[1]) + "</ul>")
            elif kind == "table":
                body.append(b[1].to_html())
            elif kind == "img":
                mime, data, *rest = images[b[1]]
                uri = f"data:{mime};base64," + base64.b64encode(data).decode("ascii")
                width = f' width="{rest[0]}"' if rest and rest[0] else ""
                body.append(f'<figure><img src="{uri}"{width} alt="{html.escape(b[2])}"></figure>')
        return (
            f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
        )
