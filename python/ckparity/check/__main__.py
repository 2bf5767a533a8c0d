"""python -m ckparity.check: the pass rule as docs/plugins.md quotes it."""

from .rule import markdown

print(markdown())
