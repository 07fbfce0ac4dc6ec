"""A results README's marked tables: a table between ``<!-- NAME: what it is -->`` and ``<!-- /NAME -->`` lines, read
back as its body's cells (the run tests recompute the same cells from the run's files)."""

from __future__ import annotations

import re
from pathlib import Path


def marked_table(readme: Path, name: str) -> list[list[str]]:
    """The cells of the table marked ``name`` in ``readme``, row by row, past its header and rule."""
    text = readme.read_text()
    block = re.search(rf"<!-- {name}: .*? -->\n(.*?)<!-- /{name} -->", text, re.S).group(1)
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in block.strip().splitlines()[2:]]
