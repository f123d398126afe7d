"""Rendering a built table as Markdown, LaTeX, CSV or HTML."""

from __future__ import annotations

import html

from kdbench.tables.building import MISSING, UNCERTAIN_MARK, Table
from kdbench.tables.specs import TableError

FORMATS = ("markdown", "latex", "csv", "html")


def render(table: Table, fmt: str = "markdown") -> str:
    if fmt not in FORMATS:
        raise TableError(f"format {fmt!r} unknown (known: {', '.join(FORMATS)})")
    return {"markdown": _markdown, "latex": _latex, "csv": _csv, "html": _html}[fmt](table)


def _markdown(table: Table) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    widths = [max(len(esc(r[i])) for r in [table.header, *table.rows]) for i in range(len(table.header))]
    line = lambda cells: "| " + " | ".join(esc(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    out = [f"**{table.title}**", "", line(table.header),
           "|" + "|".join(("-" * (w + 1) + ":") if i >= table.label_columns else ("-" * (w + 2))
                          for i, w in enumerate(widths)) + "|"]
    out += [line(r) for r in table.rows]
    out += [""] + [f"- {n}" for n in table.notes]
    return "\n".join(out) + "\n"


_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}"}


def _latex_escape(text: str) -> str:
    text = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)
    return text.replace("±", r"$\pm$").replace(MISSING, "--").replace(UNCERTAIN_MARK, r"$^\dagger$")


def _latex(table: Table) -> str:
    cols = "l" * table.label_columns + "r" * (len(table.header) - table.label_columns)
    out = [r"\begin{table}[t]", r"\centering", r"\small", rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
           " & ".join(_latex_escape(h) for h in table.header) + r" \\", r"\midrule"]
    out += [" & ".join(_latex_escape(c) for c in row) + r" \\" for row in table.rows]
    out += [r"\bottomrule", r"\end{tabular}",
            rf"\caption{{{_latex_escape(table.title)}. " + " ".join(_latex_escape(n) for n in table.notes) + "}",
            rf"\label{{tab:{table.name}}}", r"\end{table}"]
    return "\n".join(out) + "\n"


def _csv(table: Table) -> str:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.header)
    writer.writerows(table.rows)
    return buffer.getvalue()


def _html(table: Table) -> str:
    out = [f"<table class=\"kdbench-table\" id=\"{html.escape(table.name)}\">",
           f"<caption>{html.escape(table.title)}</caption>",
           "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in table.header) + "</tr></thead>", "<tbody>"]
    for row in table.rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody>")
    if table.notes:
        out.append("<tfoot>" + "".join(f"<tr><td colspan=\"{len(table.header)}\">{html.escape(n)}</td></tr>"
                                       for n in table.notes) + "</tfoot>")
    out.append("</table>")
    return "\n".join(out) + "\n"
