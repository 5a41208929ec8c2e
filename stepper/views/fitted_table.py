"""A table fitted to a terminal's width, each header over its values in every layout, no column
dropped and no value cut.

Wide enough, it is one Rich table. Narrower, the long columns (`under`: notes, what changed, a
source line) go each on lines of their own under their row, wrapped at words, their headers in the
same places under the header; narrower still, a row's first column and its key (the tensor's
name) take a line of their own and its other short columns the next; and on a terminal too narrow
even for that, each row is its key and then its cells, each labelled.
"""

from __future__ import annotations

import math

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

Cell = str | Text
Columns = tuple[tuple[str, str], ...]  # (header, "left" | "right") in order
GAP = 2  # spaces between columns, as a Rich table without a box puts them


def fitted(title: str, columns: Columns, rows: list[dict[str, Cell]], key: str, under: tuple[str, ...],
           width: int | None) -> RenderableType:
    """The rows (cells by header) for a terminal `width` wide (None: a pipe or a notebook, every
    row on one line), titled `title` (empty: none)."""
    if width is None or natural_width(columns, rows) <= width:
        return whole_table(title, columns, rows, under)
    short = tuple(c for c in columns if c[0] not in under)
    split = [c for c, _ in short].index(key) + 1
    head, rest = short[:split], short[split:]
    indent = natural_width(head[:-1], rows) + GAP if split > 1 else GAP  # where the key's column starts
    if natural_width(short, rows) <= width:
        lines = [short]
    elif rest and max(natural_width(head, rows), indent + natural_width(rest, rows)) <= width:
        lines = [head, rest]
    else:
        return labelled(title, columns, rows, key)
    return Group(*([Text(title, style="bold")] if title else []), *stacked(columns, rows, lines, under, indent))


def natural_width(columns: Columns, rows: list[dict[str, Cell]]) -> int:
    """The width of `columns` side by side, each as wide as its widest line."""
    return sum(column_width(c, rows) for c, _ in columns) + GAP * (len(columns) - 1)


def column_width(column: str, rows: list[dict[str, Cell]]) -> int:
    return max(cell_len(line) for text in [column, *(str(r[column]) for r in rows)] for line in text.split("\n"))


def whole_table(title: str, columns: Columns, rows: list[dict[str, Cell]], under: tuple[str, ...]) -> Table:
    """One Rich table; where it is drawn narrower than it would be (a notebook's fixed width), the
    `under` columns wrap at words and the rest keep their lines whole."""
    table = Table(title=title or None, title_justify="left", show_edge=False, pad_edge=False, header_style="bold",
                  box=None)
    for column, justify in columns:
        table.add_column(column, justify=justify, no_wrap=column not in under)
    for cells in rows:
        table.add_row(*(cells[c] for c, _ in columns))
    return table


def stacked(columns: Columns, rows: list[dict[str, Cell]], lines: list[Columns], under: tuple[str, ...],
            indent: int) -> list[RenderableType]:
    """The header and each row as `lines` of short columns (the second and later `indent` spaces
    in), then each `under` column's cell on lines of its own, `indent` spaces in."""
    widths = {c: column_width(c, rows) for line in lines for c, _ in line}
    headers: dict[str, Cell] = {c: Text(c, style="bold") for c, _ in columns}
    out: list[RenderableType] = []
    for cells in [headers, *rows]:
        for i, line in enumerate(lines):
            if i and not any(str(cells[c]) for c, _ in line):  # a line of empty cells: a dash, not a blank line
                cells = {**cells, line[0][0]: Text("-", style="dim")}
            out.append(Text(" " * (indent if i else 0)) + side_by_side(line, cells, widths))
        for column in under:
            if str(cells[column]):
                out.append(Padding(under_cell(cells[column], cells is headers), (0, 0, 0, indent)))
    return out


def under_cell(cell: Cell, header: bool) -> Text:
    """An `under` column's cell on its own line: a header bold, a plain value dim, a styled one as it is."""
    if isinstance(cell, Text) and (cell.style or cell.spans):
        return cell
    return Text(str(cell), style="bold" if header else "dim")


def side_by_side(line: Columns, cells: dict[str, Cell], widths: dict[str, int]) -> Text:
    """One line of cells, each padded to its column's width as its justification says."""
    out = Text()
    for i, (column, justify) in enumerate(line):
        cell = cells[column] if isinstance(cells[column], Text) else Text(str(cells[column]))
        pad = " " * (widths[column] - cell.cell_len)
        last = i == len(line) - 1
        out += Text(" " * GAP if i else "") + (Text(pad) + cell if justify == "right" else cell + ("" if last else pad))
    return out


def labelled(title: str, columns: Columns, rows: list[dict[str, Cell]], key: str) -> Group:
    """Each row as its key, then its other non-empty cells labelled, wrapped at words two spaces in."""
    out: list[RenderableType] = [Text(title, style="bold")] if title else []
    out.append(Text(f"{key} and then its " + ", ".join(c for c, _ in columns if c != key), style="bold"))
    for cells in rows:
        out.append(Text(str(cells[key]), style="bold"))
        rest = [Text.assemble((f"{column} ", "dim"), cells[column]) for column, _ in columns
                if column != key and str(cells[column])]
        out.append(Padding(Text("  ").join(rest), (0, 0, 0, 2)))
    return Group(*out)


def figure(x: float | None) -> str:
    """An error figure for a cell: exponent form with two decimals, 0 for zero, blank when absent."""
    if x is None:
        return ""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.2e}" if x else "0"
