"""Claims in the docs stay tied to their sources.

* Every "docs/design.md §N" the code and tests cite names a section that exists.
* README.md's headline table matches the committed result file it cites. The table is marked by an HTML comment
  right above it (invisible on GitHub)::

      <!-- checked-table: benchmarks/results/RUN/bf16/summary.json
           columns: averages.{method}.tau averages.{method}.speedup -->
      | method | τ | speedup vs AR |
      |---|---|---|
      | **fold α=2** | 2.948 | **2.261**× |

  ``columns`` gives, for every column after the first, a dotted path into the JSON (``{method}`` is the row's key:
  its first cell without markdown, without a parenthesis, lowercased, ``α=`` written ``-a`` and spaces as ``-``, so
  "**fold α=2**" -> ``fold-a2`` and "dflash (original)" -> ``dflash``), ``FILE:path`` to read another JSON file
  (repository-relative), or ``-`` for a column that is not checked. ``rows: KEY KEY ...`` (optional, before
  ``columns``) gives the rows' keys explicitly, in order, for labels the rule above does not map. The first number of each checked cell must
  be the JSON value rounded to the decimals the cell shows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*checked-table:\s*(?P<file>\S+)\s+(?:rows:\s*(?P<rows>.*?)\s+)?columns:\s*(?P<columns>.*?)\s*-->",
                    re.S)
NUMBER = re.compile(r"[-−]?\d[\d,]*(?:\.\d+)?")


def row_key(label: str) -> str:
    label = re.sub(r"\(.*?\)", "", label.replace("*", "").replace("`", "")).strip().lower()
    return re.sub(r"\s+", "-", label.replace("α=", "-a").replace("α =", "-a").replace(" -a", "-a"))


def lookup(data, dotted: str, method: str, where: str):
    node = data
    for part in dotted.replace("{method}", method).split("."):
        if not isinstance(node, dict) or part not in node:
            raise AssertionError(f"{where}: no {part!r} on the path {dotted!r} (row {method!r})")
        node = node[part]
    return node


def checked_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(json file, column paths, table rows as cells) for each marked table of a markdown text; with ``rows:`` in
    the marker, each row's first cell is replaced by the key given there (in order)."""
    tables = []
    for match in MARKER.finditer(text):
        lines = text[match.end():].lstrip("\n").splitlines()
        rows = []
        for line in lines:
            if not line.startswith("|"):
                break
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        assert len(rows) >= 3, f"the checked table after {match.group(0)[:80]!r} has no rows"
        body = rows[2:]
        if match.group("rows"):
            keys = match.group("rows").split()
            assert len(keys) == len(body), f"the marker names {len(keys)} rows, the table has {len(body)}"
            body = [[key] + cells[1:] for key, cells in zip(keys, body)]
        tables.append((match.group("file"), match.group("columns").split(), body))
    return tables


def check_table(json_file: str, columns: list[str], rows: list[list[str]], root: Path = ROOT) -> int:
    """Compare every checked cell; returns how many cells were compared."""
    loaded: dict[str, object] = {}

    def data_of(path: str):
        if path not in loaded:
            full = root / path
            assert full.is_file(), f"the checked table cites {path}, which is not in the repository"
            loaded[path] = json.loads(full.read_text())
        return loaded[path]

    compared = 0
    for cells in rows:
        assert len(cells) == len(columns) + 1, f"row {cells} has {len(cells)} cells for {len(columns)} columns + 1"
        method = row_key(cells[0])
        for spec, cell in zip(columns, cells[1:]):
            if spec == "-":
                continue
            path, _, dotted = spec.rpartition(":") if ":" in spec else ("", "", spec)
            where = f"README table row {cells[0]!r}, column {spec!r}"
            value = lookup(data_of(path or json_file), dotted, method, where)
            found = NUMBER.search(cell.replace("**", ""))
            assert found, f"{where}: no number in {cell!r}"
            shown = found.group(0).replace(",", "").replace("−", "-")
            decimals = len(shown.partition(".")[2])
            # the shown number is the value rounded to the decimals shown (either way at an exact half)
            assert abs(float(value) - float(shown)) <= 0.5 * 10**-decimals + 1e-12, (
                f"{where}: README shows {shown}, {path or json_file} has {value}")
            compared += 1
    return compared


def test_readme_headline_table_matches_the_result_file_it_cites():
    tables = checked_tables((ROOT / "README.md").read_text())
    assert tables, "README.md has no headline table marked '<!-- checked-table: FILE columns: ... -->' (tests/test_docs.py)"
    for json_file, columns, rows in tables:
        assert check_table(json_file, columns, rows) > 0


def test_the_table_check_catches_a_drifted_number(tmp_path):
    result = tmp_path / "summary.json"
    result.write_text(json.dumps({"averages": {"fold-a2": {"tau": 2.9475, "speedup": 2.2606},
                                               "dflash": {"tau": 2.0246, "speedup": 1.5743}}}))
    text = ("<!-- checked-table: summary.json\n     columns: averages.{method}.tau averages.{method}.speedup -->\n"
            "| method | τ | speedup |\n|---|---|---|\n| **fold α=2** | 2.948 | **2.26**× |\n"
            "| dflash (original) | 2.02 | 1.574 |\n")
    (json_file, columns, rows), = checked_tables(text)
    assert [row_key(r[0]) for r in rows] == ["fold-a2", "dflash"]
    assert check_table(json_file, columns, rows, tmp_path) == 4
    with pytest.raises(AssertionError, match="README shows 2.949"):
        check_table(json_file, columns, checked_tables(text.replace("2.948", "2.949"))[0][2], tmp_path)
    keyed = text.replace("columns:", "rows: fold-a2 dflash\n     columns:").replace("dflash (original)", "the original")
    assert check_table(*checked_tables(keyed)[0], tmp_path) == 4
    with pytest.raises(AssertionError, match="no 'fold-a3'"):
        check_table(json_file, columns, checked_tables(text.replace("fold α=2", "fold α=3"))[0][2], tmp_path)


def test_design_citations_resolve():
    design = (ROOT / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^## (\d+)\. ", design, flags=re.M))
    cited = {}
    for path in list((ROOT / "fold_hf").rglob("*.py")) + list((ROOT / "tests").glob("*.py")):
        for number in re.findall(r"docs/design\.md §(\d+)", path.read_text()):
            cited.setdefault(number, []).append(str(path.relative_to(ROOT)))
    assert cited, "no citation found: the check would be empty"
    missing = {n: where for n, where in cited.items() if n not in sections}
    assert not missing, f"docs/design.md has no section for: {missing}"
    stray = [str(p.relative_to(ROOT)) for p in list((ROOT / "fold_hf").rglob("*.py")) + list((ROOT / "tests").glob("*.py"))
             if p.name != "test_docs.py" and "DESIGN §" in p.read_text()]
    assert not stray, f"cite docs/design.md §N, not DESIGN §N (no such file in the repository): {stray}"
