"""Read reports, write the summary table and the figure: what ``mpisdnn report`` does."""

from __future__ import annotations

from ..errors import UsageError
from .load import load_report
from .tables import format_table, scaling_rows

__all__ = ["summarise_reports"]

#: Range of figure resolutions accepted (below, text is unreadable; above, files are huge).
DPI_RANGE = (50, 1200)


def summarise_reports(paths, table=None, figure=None, title=None, dpi=200):
    """Validate the reports at ``paths``, build the table, write it and the figure if asked.

    Parameters
    ----------
    paths : list of path-like
        JSON reports, all of one kind.
    table, figure : path-like, optional
        Where to write the Markdown table and the figure (.png, .pdf, .svg).
    title : str, optional
        Figure title (default: derived from the reports).
    dpi : int
        PNG resolution.

    Returns
    -------
    (str, str or None)
        The table text and the figure path written (``None`` without ``figure``).

    Raises
    ------
    InputError
        A report is missing or invalid (the message names it).
    UsageError
        Mixed report kinds, a bad ``dpi`` or figure format, or no matplotlib.
    """
    if not DPI_RANGE[0] <= dpi <= DPI_RANGE[1]:
        raise UsageError(f"--dpi {dpi}: expected {DPI_RANGE[0]}..{DPI_RANGE[1]}")
    reports = [load_report(p) for p in paths]
    if len({r["kind"] for r in reports}) > 1:
        raise UsageError("cannot mix inference and projection reports in one summary")
    text = format_table(scaling_rows(reports))
    if table:
        from ..formats._atomic import atomic_path

        with atomic_path(table) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    written = None
    if figure:
        from .plots import plot_reports

        written = plot_reports(reports, figure, title=title, dpi=dpi)
    return text, written
