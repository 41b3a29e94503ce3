# `import workbook` first: it chooses GPU or simulator (WORKBOOK_DEVICE) before numba.cuda is imported.
import workbook

print(f"workbook tests in {workbook.MODE} mode")
