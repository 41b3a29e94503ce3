"""How the workbook draws its tables: one width, one way to print a figure.

Every table fits a 100-column terminal or notebook cell; rich wraps the text of a cell that would
not fit rather than the table."""

WIDTH = 100


def console(**options):
    """A rich Console of the workbook's width (options: rich's, e.g. record=True)."""
    from rich.console import Console

    return Console(width=WIDTH, **options)


def fmt(value, spec, suffix=""):
    """A figure as text, "-" where there is none."""
    return "-" if value is None else format(value, spec) + suffix
