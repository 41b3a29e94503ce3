# spconv 2.x, the chapter's baseline where it is installed, takes seconds to import: on a GPU the
# runner imports it while the chapter before runs (workbook/runner.py's _READY)
PRELUDE = ("spconv.pytorch",)
