"""Markdown tables for the benchmark reports: one formatter, so every table lines up alike."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

__all__ = ["markdown_table"]


def markdown_table(
    columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[object]], left: Collection[int]
) -> str:
    """``columns`` are (header, format spec) pairs; columns in ``left`` align left, the rest
    right (numbers), padded to the widest cell."""
    cells = [
        [fmt.format(value) for (_name, fmt), value in zip(columns, row, strict=True)]
        for row in rows
    ]
    header = [name for name, _fmt in columns]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        padded = [
            value.ljust(width) if i in left else value.rjust(width)
            for i, (value, width) in enumerate(zip(values, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    divider = (
        "|"
        + "|".join(
            ":" + "-" * (w + 1) if i in left else "-" * (w + 1) + ":" for i, w in enumerate(widths)
        )
        + "|"
    )
    return "\n".join([line(header), divider, *(line(row) for row in cells)])
