"""A rich table whose rows are grouped under problem keys, each key printed whole on a line of its
own above its rows.

A problem key is meant to be copied back as --shape. In a table column narrower than itself a
key is folded mid-token (`b=1,h=2,hk` / `v=1,...`) and no longer pastes; here a key never shares
its line with a column. So that the figures below the keys still line up, every group is drawn
as a table of the same column widths, measured once over all of them.

Print it with crop=False: a key wider than the terminal then runs past its edge instead of being
cut there (the terminal wraps it, the text stays one line).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"
    wrap: bool = False
    """Whether the column may wrap (at spaces, folding only longer words) in a narrow terminal;
    the others keep their cells whole."""
    min_width: int = 1


# The rows sit this far right of their keys, so that the eye finds the keys.
INDENT = 2


class KeyedTable:
    """Rows under keys: add_row(key, *cells); consecutive rows of one key share its line."""

    def __init__(self, columns: list[Column], title: str | None = None, caption: str | None = None):
        self.columns = list(columns)
        self.title = title
        self.caption = caption
        self.groups: list[tuple[str, list[tuple[str, ...]]]] = []

    def add_row(self, key: str, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        if self.groups and self.groups[-1][0] == key:
            self.groups[-1][1].append(cells)
        else:
            self.groups.append((key, [cells]))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = self._widths(console, options.update_width(max(options.max_width - INDENT, 1)))
        if self.title:
            yield Text.from_markup(self.title)
        yield Padding(self._table(widths, [], header=True), (0, 0, 0, INDENT))
        for key, rows in self.groups:
            yield Text(key, style="bold", no_wrap=True, overflow="ignore")
            yield Padding(self._table(widths, rows, header=False), (0, 0, 0, INDENT))
        if self.caption:
            yield Text(self.caption)

    def _table(self, widths: list[int], rows: list[tuple[str, ...]], header: bool) -> Table:
        table = Table(box=box.SIMPLE_HEAD, show_header=header, show_edge=False, pad_edge=False,
                      collapse_padding=True)
        for column, width in zip(self.columns, widths):
            table.add_column(column.header, justify=column.justify, width=width,
                             no_wrap=not column.wrap, overflow="fold" if column.wrap else "ellipsis")
        for cells in rows:
            table.add_row(*cells)
        return table

    def _widths(self, console: Console, options: ConsoleOptions) -> list[int]:
        """Each column as wide as its widest cell; where that is wider than the terminal, the
        columns that may wrap give up width, down to their longest word."""
        widest, narrowest = [], []
        for index, column in enumerate(self.columns):
            cells = [column.header] + [row[index] for _, rows in self.groups for row in rows]
            sizes = [Measurement.get(console, options, Text.from_markup(cell)) for cell in cells]
            most = max(max(size.maximum for size in sizes), column.min_width)
            widest.append(most)
            least = max(max(size.minimum for size in sizes), column.min_width)
            narrowest.append(min(least, most) if column.wrap else most)
        overhead = Measurement.get(console, options, self._table([1] * len(widest), [], header=False)).maximum
        overhead -= len(widest)
        widths = list(widest)
        excess = sum(widths) + overhead - options.max_width
        for index in sorted(range(len(widths)), key=lambda i: narrowest[i] - widths[i]):
            if excess <= 0:
                break
            give = min(excess, widths[index] - narrowest[index])
            widths[index] -= give
            excess -= give
        return widths
