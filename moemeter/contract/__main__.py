"""`python -m moemeter.contract` prints docs/metrics.md's table of families."""

from .families import markdown_table

print(markdown_table(), end="")
