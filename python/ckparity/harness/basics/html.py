"""One self-contained HTML page per report: no network, no script, the plots
embedded as PNG data URIs, the tables the commands print (their Markdown pipe
tables) as HTML tables, every text escaped. What a person opens from a CI
artifact or mails to a colleague; the JSON stays the record. ``--html FILE``
on train, repro, compare, check, gate and zoo writes one (report.write_text:
atomically)."""

from __future__ import annotations

import base64
import html
import io
import re

STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:75em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #bbb;padding:0.25em 0.6em;
text-align:left}th{background:#eee}tr:nth-child(even) td{background:#fafafa}img{max-width:100%}
.fail{color:#b00;font-weight:bold}.pass{color:#070;font-weight:bold}"""


def _cell(text: str) -> str:
    """A Markdown cell's text, escaped, its **bold** kept (the gates' **FAIL**)."""
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(text))


def markdown_table(text: str) -> str:
    """The pipe-table lines of ``text`` as <table>s (a header row, the separator dropped); any other
    non-empty line a paragraph."""
    out, rows = [], []

    def flush():
        if rows:
            head, body = rows[0], rows[1:]
            out.append("<table><tr>" + "".join(f"<th>{_cell(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</table>")
            rows.clear()
    for line in text.splitlines():
        if line.startswith("|"):
            if not set(line.strip()) <= set("|-: "):  # not the |---|---| separator
                rows.append([c.strip().replace("\\|", "|") for c in line.strip().strip("|").split(" | ")])
            continue
        flush()
        if line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "\n".join(out)


def png(fig) -> str:
    """A matplotlib figure as an <img> with the PNG inline."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(fig.get_suptitle() or "plot")}" src="data:image/png;base64,{data}">'


def verdict(passed: bool, text: str) -> str:
    return f'<p class="{"pass" if passed else "fail"}">{html.escape(text)}</p>'


def page(title: str, *blocks: str) -> str:
    """The page: the title as its heading, then the blocks (HTML made by the functions above)."""
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>\n" + "\n".join(blocks)
            + "\n</body></html>\n")
