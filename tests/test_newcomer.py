"""What a new user meets first: the CLI's help and errors, the README's quick start, packaging, plots (issue #22)."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fold_hf import FoldConfig
from fold_hf.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "nothing on stderr"
    return err[-1]


# ------------------------------------------------------------------------------------------------ bench arguments
def test_bench_rejects_a_misspelled_method_and_lists_the_valid_ones(capsys):
    # ("fold", the mode's name, is an alias of fold-a2 since issue 40: tests/integrations/test_messages.py)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--methods", "fodl", "--build-only"])
    assert exit_.value.code == 2
    line = _error_line(capsys)
    assert "invalid choice: 'fodl'" in line
    for name in ("fold-a2", "dflash", "window", "rerope", "yarn"):
        assert repr(name) in line


def test_bench_takes_the_mode_name_fold_as_fold_a2():
    from fold_hf.bench.methods import resolve_methods

    assert resolve_methods(["fold", "fold-a2", "window"]) == ["fold-a2", "window"]


def test_bench_rejects_an_unknown_suite(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--suites", "foo", "--build-only"])
    line = _error_line(capsys)
    assert "invalid choice: 'foo'" in line and "'retrieval'" in line


def test_bench_method_names_follow_the_benchmark_methods():
    """New reading modes added to the benchmark appear in the CLI without a second list."""
    from fold_hf.bench import default_methods
    from fold_hf.cli import bench_method_names

    assert bench_method_names() == tuple(m.name for m in default_methods(512, 768))


def test_every_option_has_help_and_shows_its_default():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"fold-hf {name} {action.option_strings[0]} has no help"
        text = sub.format_help()
        if name == "bench":
            assert "fold-a2" in text and "retrieval" in text  # the valid names, from the code
            assert re.search(r"--per-tier PER_TIER\s+requests per suite and input length \(default: 8\)", text)
            assert "1024 2048 4096 8192" in text
        if name == "train-drafter":
            assert "(default: 6)" in text and "(default: 10000)" in text


def test_help_imports_neither_torch_nor_transformers():
    """`fold-hf --help` and `fold-hf bench --help` (its method, suite and engine choices listed) stay quick because the
    package imports torch only when a command needs it (the time is recorded in
    benchmarks/results/2026-12-01-cli-startup/README.md, not asserted here)."""
    code = ("import argparse, sys; from fold_hf.cli import build_parser; parser = build_parser(); parser.format_help(); "
            "sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)); "
            "text = sub.choices['bench'].format_help(); assert 'fold-a2' in text and 'retrieval' in text, text; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_bench_without_out_writes_under_fold_hf_bench_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "requests.jsonl").write_text("")
    import fold_hf.pairs
    from fold_hf.cli import CliError

    monkeypatch.setattr(fold_hf.pairs, "load_pair", lambda *a, **k: (_ for _ in ()).throw(CliError("stop here")))
    assert main(["bench", "--device", "cpu", "--requests", str(tmp_path / "requests.jsonl")]) == 2
    out = capsys.readouterr().out
    assert "results go to" in out and "fold-hf-bench" in out and "--out" in out
    assert not (tmp_path / "benchmarks").exists()


# ------------------------------------------------------------------------------------------------ one-line errors
def test_unknown_preset_lists_the_presets_without_asking_the_hub(monkeypatch):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("the Hub was asked for a name that is not a repo id")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    with pytest.raises(FileNotFoundError) as err:
        FoldConfig.from_pretrained("smollm2-135m")
    message = str(err.value)
    assert "did you mean 'smollm2-135m-dflash'" in message and "llama3.1-8b-dflash" in message


def test_doctor_with_missing_paths_or_presets_prints_one_line(capsys):
    assert main(["doctor", "--target-config", "/nonexistent"]) == 2
    assert _error_line(capsys) == "fold-hf doctor: error: --target-config /nonexistent: no such directory"
    assert main(["doctor", "--drafter", "/nonexistent"]) == 2
    assert "--drafter /nonexistent: no such directory" in _error_line(capsys)
    assert main(["doctor", "--config", "nosuchpreset"]) == 2
    line = _error_line(capsys)
    assert line.startswith("fold-hf doctor: error: --config:") and "smollm2-135m-dflash" in line


def test_demo_without_the_demo_extra_names_it(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    assert main(["demo", "--device", "cpu"]) == 2
    line = _error_line(capsys)
    assert line.startswith("fold-hf demo: error:") and 'pip install "fold-hf[demo]"' in line


def test_summarize_reads_a_runs_file_at_the_top_of_the_folder(tmp_path, capsys):
    committed = ROOT / "benchmarks" / "results" / "2026-11-30-cpu-drafter-v2" / "runs.jsonl"
    (tmp_path / "runs.jsonl").write_text(committed.read_text())
    assert main(["summarize", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {r["method"] for r in summary["rows"]} == {"fold-a2", "dflash", "window"}
    assert main(["summarize", str(tmp_path / "empty")]) == 2
    assert "is not a directory" in _error_line(capsys)


# ------------------------------------------------------------------------------------------------ doctor
def test_doctor_trusts_the_drafters_own_training_length_over_a_preset(tmp_path):
    from fold_hf.doctor import diagnose
    from tiny import tiny_drafter, tiny_target

    target = tiny_target("llama")
    drafter = tiny_drafter(target, fold_config=FoldConfig(window=16, train_length=64))
    drafter.save_pretrained(tmp_path / "drafter")
    (tmp_path / "drafter" / "training.json").write_text(json.dumps({"settings": {"prompt_tokens": 48,
                                                                                 "new_tokens": 16}}))
    from fold_hf import FoldDrafter

    drafter = FoldDrafter.from_pretrained(tmp_path / "drafter")
    checks = {c.name: c for c in diagnose(target, drafter, FoldConfig.from_pretrained("llama3.1-8b-dflash"))}
    window = checks["window vs training length"]
    assert window.status == "warn" and "exceeds the training length 64" in window.message
    assert checks["train_length"].status == "warn" and "3072" in checks["train_length"].message
    # the committed drafter records 768 tokens (512 real + 256 generated)
    from fold_hf.embedded import DEFAULT_DRAFTER, recorded_training_length

    assert recorded_training_length(DEFAULT_DRAFTER)[0] == 768


# ------------------------------------------------------------------------------------------------ plots
def test_plots_show_one_and_the_ar_line_and_n_per_point():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from fold_hf.bench import plot_figure

    row = dict(suite="code", tier=1024, method="fold-a2", requests=2, tau=3.02, tau_ci_low=3.0, tau_ci_high=3.04,
               speedup=2.51, speedup_ci_low=2.5, speedup_ci_high=2.52)
    table = [row, {**row, "method": "window", "tau": 2.98, "tau_ci_low": 2.96, "tau_ci_high": 3.0, "speedup": 2.49,
                   "speedup_ci_low": 2.48, "speedup_ci_high": 2.5}]
    for metric in ("tau", "speedup"):
        fig = plot_figure(table, metric)
        ax = fig.axes[0]
        low, high = ax.get_ylim()
        assert low == 0.0 and high > 2.5  # a 0.04 gap is not zoomed into the whole panel
        assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.get_lines())  # the AR line
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1K\nn=2"]
        legend = fig.legends[0]
        assert legend.get_bbox_to_anchor().x0 >= fig.bbox.x1 - 1  # outside the panels
        assert {t.get_text() for t in legend.get_texts()} == {"fold-a2", "window", "AR"}


# ------------------------------------------------------------------------------------------------ packaging
def test_license_and_project_metadata():
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10
        pytest.skip("tomllib needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["authors"] and project["license"] == {"text": "Apache-2.0"}


# ------------------------------------------------------------------------------------------------ README
def readme_quick_start() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_quick_start_runs_on_a_cpu_as_written(capsys, monkeypatch, real_pair):
    code = readme_quick_start()
    assert len(code.strip().splitlines()) <= 12 and "load_embedded_pair" in code
    # the session's pair stands in for loading it again (the fixture loads it with fold_hf.load_embedded_pair, fp32 on
    # the CPU, what the quick start asks for)
    import fold_hf

    asked = []
    monkeypatch.setattr(fold_hf, "load_embedded_pair", lambda *a, **kw: asked.append((a, kw)) or real_pair)
    try:
        exec(compile(code, "README.md (Quick start)", "exec"), {"__name__": "__readme__"})
    finally:
        fold_hf.generation.release_fast_state(real_pair[0])  # the shared target keeps no fast-loop session
    assert asked == [((), {"device": "cpu", "dtype": "float32"})]
    assert "tau" in capsys.readouterr().out


def test_a_drafter_in_another_dtype_than_its_target_is_named_once():
    import warnings

    import torch

    from tiny import tiny_drafter, tiny_target

    target = tiny_target("llama", dtype=torch.float32)
    drafter = tiny_drafter(target).to(torch.bfloat16)
    with pytest.warns(UserWarning, match=r"drafter is torch.bfloat16 and the target torch.float32.*dtype="):
        drafter.bind_target(target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drafter.bind_target(target)  # once per drafter, not once per generate call


def test_readme_results_table_matches_the_result_files_it_cites():
    """The headline numbers are read back from the committed run, so the README cannot drift from it: τ and speedup
    from its summary, the paired Δτ and its CI from the summary's paired rows, τ at 8K over τ at 2K and the replaced
    drafter's τ recomputed here from the per-request rows."""
    text = (ROOT / "README.md").read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    run = ROOT / "benchmarks" / "results" / "2026-12-06-nvidia-h100-smollm2-mix-drafter"
    assert "benchmarks/results/2026-12-06-nvidia-h100-smollm2-mix-drafter/README.md" in text and "2026-12-06" in text
    summary = json.loads((run / "new" / "summary.json").read_text())
    averages = summary["averages"]
    paired = {r["other"]: r for r in summary["paired"]["rows"] if r["suite"] == "all"}

    def taus_of(name):
        taus: dict = {}
        for line in (run / name / "run" / "runs.jsonl").read_text().splitlines():
            row = json.loads(line)
            taus.setdefault((row["method"], row["tier"]), []).append(row["tau"])
        return taus

    taus, old = taus_of("new"), taus_of("old")
    names = {"FOLD α=2": "fold-a2", "window only": "window", "dflash": "dflash"}
    table = text[text.index("| method |"):].split("\n\n", 1)[0]  # the first table of the section
    rows = [line for line in table.splitlines() if "---" not in line][1:]
    assert len(rows) == len(names)
    number = r"[+−-]?\d+\.\d+"
    for line in rows:
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        method = next(m for label, m in names.items() if cells[0].startswith(label))
        assert float(cells[1]) == pytest.approx(averages[method]["tau"], abs=5e-4), method
        assert float(cells[2].strip("*").rstrip("×")) == pytest.approx(averages[method]["speedup"], abs=5e-4), method
        if method == "fold-a2":
            assert cells[3] == "—"
        else:
            shown = [float(x.replace("−", "-")) for x in re.findall(number, cells[3])]
            r = paired[method]
            assert shown == pytest.approx([r["delta_tau"], r["delta_tau_ci_low"], r["delta_tau_ci_high"]], abs=5e-4)
        tiers = sorted(t for m, t in taus if m == method)
        assert tiers == [2048, 8192]
        mean = {t: sum(taus[method, t]) / len(taus[method, t]) for t in tiers}
        assert float(cells[4]) == pytest.approx(mean[8192] / mean[2048], abs=5e-3), method
        old_all = old[method, 2048] + old[method, 8192]
        assert float(cells[5]) == pytest.approx(sum(old_all) / len(old_all), abs=5e-4), method


def test_bench_shard_must_be_i_of_n(capsys):
    for bad in ("2/2", "1-2", "x/3"):
        with pytest.raises(SystemExit):
            main(["bench", "--shard", bad])
        assert "--shard" in _error_line(capsys)
    assert build_parser().parse_args(["bench", "--shard", "1/2"]).shard == (1, 2)


def test_demo_with_a_missing_drafter_prints_one_line(capsys):
    """Issue #40: a 16-line traceback where doctor printed one line."""
    assert main(["demo", "--device", "cpu", "--drafter", "/nonexistent/drafter"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == "fold-hf demo: error: --drafter /nonexistent/drafter: no such directory"
    assert "Traceback" not in captured.out + captured.err


def test_bench_accepts_the_reading_modes_names_as_aliases(capsys):
    from fold_hf.bench.methods import MODE_ALIASES, method_names, resolve_methods
    from fold_hf.modeling.fold_config import MODES

    args = build_parser().parse_args(["bench", "--methods", "fold", "window", "fold-a4"])
    assert resolve_methods(args.methods) == ["fold-a2", "window", "fold-a4"]
    assert resolve_methods(["fold", "fold-a2"]) == ["fold-a2"]  # an alias and its method run once
    # every reading mode is accepted by its own name: a method of that name or an alias
    assert all(mode in method_names() or mode in MODE_ALIASES for mode in MODES)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--methods", "folds"])
    assert "invalid choice: 'folds'" in _error_line(capsys)
