"""python -m ckparity.kernels: the records as the Markdown table docs/kernels.md
holds between its "kernel records" markers (tests/test_spine.py keeps the two equal)."""

from .spine import table

print(table())
