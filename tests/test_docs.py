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

  A path segment may select list items: ``rows[suite=all&other={method}]`` keeps the items whose fields equal those
  values (one item: that item; several: the next segments are read from each and the numbers averaged). A column
  ``A,B,C`` compares the cell's first three numbers with three paths (a value and its CI), ``A//B`` the ratio of two
  values. A cell "—" is checked too: the JSON must have no value there (e.g. FOLD against itself).

* Every marked table in README.md and benchmarks/results/README.md (the run index) is checked, and every column of
  it: a ``-`` column fails.
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


def _segments(dotted: str) -> list[str]:
    return re.findall(r"[^.\[]+(?:\[[^\]]*\])?", dotted)


def lookup(data, dotted: str, method: str, where: str):
    """The value at ``dotted`` (``{method}`` filled in); list selections ``name[k=v&k2=v2]`` average over the items
    they keep."""
    nodes = [data]
    for part in _segments(dotted.replace("{method}", method)):
        name, _, selector = part.partition("[")
        next_nodes = []
        for node in nodes:
            if not isinstance(node, dict) or name not in node:
                raise AssertionError(f"{where}: no {name!r} on the path {dotted!r} (row {method!r})")
            value = node[name]
            if selector:
                wanted = dict(item.split("=", 1) for item in selector.rstrip("]").split("&"))
                value = [v for v in value if all(str(v.get(k)) == w for k, w in wanted.items())]
                if not value:
                    raise AssertionError(f"{where}: no item of {name!r} has {wanted} (row {method!r})")
                next_nodes += value
            else:
                next_nodes.append(value)
        nodes = next_nodes
    return nodes[0] if len(nodes) == 1 else sum(float(n) for n in nodes) / len(nodes)


def _expected(data_of, json_file: str, spec: str, method: str, where: str) -> list[float]:
    """The numbers a column ``spec`` asks for in row ``method`` (module docstring)."""
    values = []
    for one in spec.split(","):
        parts = []
        for term in one.split("//"):
            path, _, dotted = term.rpartition(":") if ":" in term else ("", "", term)
            parts.append(float(lookup(data_of(path or json_file), dotted, method, where)))
        values.append(parts[0] / parts[1] if len(parts) == 2 else parts[0])
    return values


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
            where = f"table row {cells[0]!r}, column {spec!r}"
            assert spec != "-", f"{where}: every column of a checked table is checked"
            if cell.strip("* ") == "—":  # no value: the JSON must have none either
                with pytest.raises(AssertionError, match="no "):
                    _expected(data_of, json_file, spec, method, where)
                compared += 1
                continue
            expected = _expected(data_of, json_file, spec, method, where)
            found = NUMBER.findall(cell.replace("**", ""))
            assert len(found) >= len(expected), f"{where}: {len(expected)} numbers expected in {cell!r}"
            for value, text in zip(expected, found):
                shown = text.replace(",", "").replace("−", "-")
                decimals = len(shown.partition(".")[2])
                # the shown number is the value rounded to the decimals shown (either way at an exact half)
                assert abs(value - float(shown)) <= 0.5 * 10**-decimals + 1e-12, (
                    f"{where}: the table shows {shown}, {json_file} gives {value}")
                compared += 1
    return compared


CHECKED_DOCS = ("README.md", "benchmarks/results/README.md")


def test_readme_headline_table_matches_the_result_file_it_cites():
    tables = checked_tables((ROOT / "README.md").read_text())
    assert tables, "README.md has no headline table marked '<!-- checked-table: FILE columns: ... -->' (tests/test_docs.py)"
    for doc in CHECKED_DOCS:
        for json_file, columns, rows in checked_tables((ROOT / doc).read_text()):
            assert check_table(json_file, columns, rows) >= len(rows) * len(columns), doc


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
    with pytest.raises(AssertionError, match="the table shows 2.949"):
        check_table(json_file, columns, checked_tables(text.replace("2.948", "2.949"))[0][2], tmp_path)
    keyed = text.replace("columns:", "rows: fold-a2 dflash\n     columns:").replace("dflash (original)", "the original")
    assert check_table(*checked_tables(keyed)[0], tmp_path) == 4
    with pytest.raises(AssertionError, match="no 'fold-a3'"):
        check_table(json_file, columns, checked_tables(text.replace("fold α=2", "fold α=3"))[0][2], tmp_path)


def test_design_citations_resolve():
    design = (ROOT / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^## (\d+)\. ", design, flags=re.M))
    cited = {}
    for path in list((ROOT / "fold_hf").rglob("*.py")) + list((ROOT / "tests").rglob("*.py")):
        for number in re.findall(r"docs/design\.md §(\d+)", path.read_text()):
            cited.setdefault(number, []).append(str(path.relative_to(ROOT)))
    assert cited, "no citation found: the check would be empty"
    missing = {n: where for n, where in cited.items() if n not in sections}
    assert not missing, f"docs/design.md has no section for: {missing}"
    stray = [str(p.relative_to(ROOT)) for p in list((ROOT / "fold_hf").rglob("*.py")) + list((ROOT / "tests").rglob("*.py"))
             if p.name != "test_docs.py" and "DESIGN §" in p.read_text()]
    assert not stray, f"cite docs/design.md §N, not DESIGN §N (no such file in the repository): {stray}"


def test_the_table_check_reads_selections_cis_ratios_and_absent_cells(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({
        "rows": [{"method": "fold-a2", "tier": 1024, "tau": 3.0}, {"method": "fold-a2", "tier": 8192, "tau": 2.0},
                 {"method": "fold-a2", "tier": 8192, "tau": 3.0}, {"method": "dflash", "tier": 1024, "tau": 2.0},
                 {"method": "dflash", "tier": 8192, "tau": 1.0}],
        "paired": {"rows": [{"suite": "all", "other": "dflash", "d": 0.5, "lo": 0.25, "hi": 0.75}]}}))
    delta = "paired.rows[suite=all&other={method}].d,paired.rows[suite=all&other={method}].lo," \
            "paired.rows[suite=all&other={method}].hi"
    ratio = "rows[method={method}&tier=8192].tau//rows[method={method}&tier=1024].tau"
    text = (f"<!-- checked-table: summary.json\n     columns: {delta} {ratio} -->\n| method | Δτ | 8K / 1K |\n"
            "|---|---|---|\n| FOLD α=2 | — | 0.83 |\n| dflash | +0.50 [+0.25, +0.75] | 0.50 |\n")
    assert check_table(*checked_tables(text)[0], tmp_path) == 6  # FOLD's 8K tau is the mean of its two rows
    for wrong, right in (("0.83", "0.84"), ("+0.75]", "+0.70]"), ("| — |", "| +0.1 [0, 0] |")):
        with pytest.raises(AssertionError):
            check_table(*checked_tables(text.replace(wrong, right))[0], tmp_path)
    with pytest.raises(AssertionError, match="every column of a checked table is checked"):
        check_table(*checked_tables(text.replace(f"{ratio} -->", "- -->"))[0], tmp_path)


# ------------------------------------------------------------------------------------------------ docs vs the code
MODE_DOCS = ("README.md", "docs/reference.md", "docs/architecture.md")
BACKTICKED_LIST = re.compile(r"`[\w.-]+`(?:\s*,\s*`[\w.-]+`)+")


def _table_after(text: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the first markdown table after the line starting with ``heading``."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[2:]


def mode_problems(text: str, modes) -> list[str]:
    """Every enumeration of reading modes (a comma list of backticked names holding ``fold`` and ``dflash``) must
    name exactly ``modes``; every row of a "Reading modes" table must be a mode, and the table must have them all."""
    problems = []
    for match in BACKTICKED_LIST.finditer(text):
        names = re.findall(r"`([\w.-]+)`", match.group(0))
        if "fold" in names and "dflash" in names and set(names) != set(modes):
            problems.append(f"the list {match.group(0)!r} has {sorted(set(names) - set(modes))} that are not modes "
                            f"and misses {sorted(set(modes) - set(names))}")
    for heading in re.findall(r"^#+ Reading modes.*$", text, flags=re.M):
        rows = {row[0].strip("`") for row in _table_after(text, heading)}
        if rows != set(modes):
            problems.append(f"the table under {heading!r} has {sorted(rows - set(modes))} that are not modes and "
                            f"misses {sorted(set(modes) - rows)}")
    return problems


def preset_problems(text: str, presets) -> list[str]:
    rows = {row[0].strip("`") for row in _table_after(text, "### Presets")}
    return [] if rows == set(presets) else [f"presets table: not presets {sorted(rows - set(presets))}, "
                                            f"missing {sorted(set(presets) - rows)}"]


def cli_problems(text: str, parser) -> list[str]:
    """Each row of the command-line table (first cell ``fold-hf COMMAND ...``) names only options COMMAND has, and
    all of them."""
    import argparse

    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    problems, seen = [], set()
    for row in _table_after(text, "## Command line"):
        command = re.match(r"`fold-hf ([\w-]+)", row[0])
        if not command:
            continue
        name = command.group(1)
        seen.add(name)
        options = {o for a in commands[name]._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
        named = set(re.findall(r"(--[a-z][\w-]*)", " | ".join(row)))
        if named - options:
            problems.append(f"fold-hf {name}: the doc names {sorted(named - options)}, which it does not have")
        if options - named:
            problems.append(f"fold-hf {name}: the doc misses {sorted(options - named)}")
    if seen != set(commands):
        problems.append(f"commands in the doc {sorted(seen)}, in the code {sorted(commands)}")
    return problems


def test_docs_name_exactly_the_modes_presets_and_cli_options_the_code_has():
    from fold_hf.cli import build_parser
    from fold_hf.modeling.fold_config import MODES
    from fold_hf.modeling.presets import PRESETS

    problems = []
    for doc in MODE_DOCS:
        problems += [f"{doc}: {p}" for p in mode_problems((ROOT / doc).read_text(), MODES)]
    reference = (ROOT / "docs" / "reference.md").read_text()
    problems += [f"docs/reference.md: {p}" for p in preset_problems(reference, PRESETS)]
    problems += [f"docs/reference.md: {p}" for p in cli_problems(reference, build_parser())]
    assert not problems, "\n".join(problems)


def test_the_docs_check_fails_on_a_planted_stale_name():
    from fold_hf.cli import build_parser
    from fold_hf.modeling.fold_config import MODES
    from fold_hf.modeling.presets import PRESETS

    reference = (ROOT / "docs" / "reference.md").read_text()
    assert mode_problems(reference, MODES) == []
    # a stale mode in the field's list, a mode table row that no longer exists, a mode missing from a list
    stale = reference.replace("`infllm`, `cmr`", "`infllm`, `cmr`, `hybrid`", 1)
    assert any("'hybrid'" in p for p in mode_problems(stale, MODES))
    stale = reference.replace("| `cmr` |", "| `cmr2` |", 1)
    assert any("cmr2" in p and "misses ['cmr']" in p for p in mode_problems(stale, MODES))
    assert mode_problems("modes: `fold`, `dflash`, `window`", MODES)
    # presets and CLI options, both ways
    assert preset_problems(reference.replace("| `qwen3-8b-dspark` |", "| `qwen3-8b-dspark-v0` |"), PRESETS)
    parser = build_parser()
    assert cli_problems(reference, parser) == []
    assert any("--repeat" in p for p in cli_problems(reference.replace("[--repeats 3]", "[--repeat 3]"), parser))
    assert any("misses ['--tokens']" in p for p in cli_problems(reference.replace(" [--tokens 2048]", ""), parser))


def test_readme_demo_output_is_the_committed_demo_log():
    """The demo output block of README.md (the lines after "method  tau  tok/s ...") is copied from the run it links:
    every row, character for character, is a line of that run's demo.log, and the run is the one the text links."""
    readme = (ROOT / "README.md").read_text()
    link = re.search(r"\[run\]\((benchmarks/results/[^)]*cpu-demo[^)]*)/README\.md\)", readme)
    assert link, "README's demo paragraph links no cpu-demo run"
    log = (ROOT / link.group(1) / "demo.log").read_text().splitlines()
    block = readme[readme.index("method                                tau"):].split("```")[0].strip().splitlines()
    assert len(block) >= 4
    for line in block:
        assert line in log, line
