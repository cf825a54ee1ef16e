"""The one base of every error a user sees.

Its message says what is wrong and where (a file, a flag, a target, a window), in a sentence a
user can act on. The CLI prints it without a traceback and exits 2; the query API answers it as
a JSON error; the pages show it in place of the chart. Anything else that escapes is a bug.
"""

from __future__ import annotations


class MoemeterError(Exception):
    """An error a user sees: a bad input, a refused query, a part that cannot start."""
