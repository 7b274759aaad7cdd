"""Console tables for `dapo-jax eval` and `dapo-jax show`: rich when it is installed, plain text otherwise.

    print_table("gsm8k, step 200", ["metric", "value"], [["avg@4", "0.512"], ...])

`rich` is not a dependency (it comes with many packages); without it, or with `plain=True`, the same
table is printed as aligned text, so the output is readable in any log file.
"""

from __future__ import annotations

import sys
from typing import Sequence


def have_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def print_table(title: str | None, headers: Sequence[str], rows: Sequence[Sequence], *, file=None,
                plain: bool | None = None, wrap: Sequence[int] = ()) -> None:
    """Prints `rows` under `headers`; `wrap` lists the columns (by index) that may wrap (long texts)."""
    file = file or sys.stdout
    cells = [["" if c is None else str(c) for c in row] for row in rows]
    if plain is None:
        plain = not have_rich()
    if not plain:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        console = Console(file=file, width=None if getattr(file, "isatty", lambda: False)() else 160, highlight=False)
        if title:
            console.print(title, markup=False)
        table = Table(show_lines=bool(wrap))
        for i, h in enumerate(headers):
            table.add_column(h, overflow="fold" if i in wrap else "ellipsis", no_wrap=i not in wrap)
        for row in cells:
            table.add_row(*(Text(c) for c in row))  # Text: model output like "[1]" is not rich markup
        console.print(table)
        return
    widths = [max([len(h), *(len(line) for row in cells for line in row[i].splitlines() or [""])])
              for i, h in enumerate(headers)]
    widths = [min(w, 100) if i in wrap else w for i, w in enumerate(widths)]
    if title:
        print(title, file=file)
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line, file=file)
    print("-" * len(line), file=file)
    for row in cells:
        parts = [c.splitlines() or [""] for c in row]
        for j in range(max(len(p) for p in parts)):
            print("  ".join((p[j] if j < len(p) else "").ljust(w) for p, w in zip(parts, widths)).rstrip(), file=file)
