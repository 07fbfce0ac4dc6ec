"""The tables of ``benchmarks/results/2026-12-07-nvidia-h100-drafter-reads/README.md`` (the drafters' reads at many
packed rows, the Qwen3.5-9B round's profile, the solve by blocks, batched Gemma rounds by running rows, τ at 1K;
issues #39, #35, #38) recomputed from the files committed beside it: every row below is rebuilt from the logs,
profiles, round timings and per-request records by its own rule and must appear in the README as written. Run this
file as a script to print them."""

from __future__ import annotations

import json
import re
from pathlib import Path

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-12-07-nvidia-h100-drafter-reads"
KNOBS = ("block_m", "block_n", "num_warps", "num_stages")


def _log_rows(path: Path) -> list[dict]:
    """The timed configurations a read_splits_bench log printed (one JSON line each), value-checked."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    timed = [r for r in rows if "us" in r]
    wrong = [r for r in timed if r["rel_err"] >= 3e-3]
    # one configuration the plan never makes returned wrong values (the README says which): left out
    assert all((r["num_warps"], r["block_n"]) == (2, 64) for r in wrong), wrong
    return [r for r in timed if r["rel_err"] < 3e-3]


def tile_rows() -> list[str]:
    """§1's first table: per read the plan's default, its floor and the sweep's fastest configuration."""
    names = {"qwen35": "Qwen3.5-9B drafter, 16 / 4 heads of 256, W 4096 | 64",
             "gemma-b8": "Gemma-3-270M batched draft, 8 rows × 4 / 1 heads of 256, W 512 | 32 per row",
             "llama": "Llama-3.1-8B drafter, 32 / 8 heads of 128, W 2048 | 64"}
    out = []
    for name, label in names.items():
        rows = _log_rows(RUN / f"{name}.log")
        default = [r for r in rows if not any(k in r for k in KNOBS) and r["splits"] == "default"][0]
        best = min(rows, key=lambda r: r["us"])
        assert best["us"] > 0.9 * default["us"]  # no configuration gains 10%: the README's point
        out.append(f"| {label} | {default['us']:.2f} | {default['floor_us']:.2f} | "
                   f"{default['us'] / default['floor_us']:.2f} |")
        out.append(f"| {best['us']:.2f} |")
    return out


def split_rows() -> list[str]:
    """§1's second table: per read the default split (16 window programs, ratio 8) and the fastest setting."""
    out = []
    for name in ("qwen35-w2048", "qwen35-w4096", "gemma-b8"):
        rows = _log_rows(RUN / "solve" / f"{name}.log")
        default = [r for r in rows if r["window_splits"] == 16 and "split_kv_ratio" not in r][0]
        best = min(rows, key=lambda r: r["us"])
        out.append(f"| {default['us']:.2f} | {best['us']:.2f} |")
    sliding = {(r["window_splits"], r.get("split_kv_ratio")): r["us"] for r in _log_rows(RUN / "solve" / "qwen35-w2048.log")}
    full = {(r["window_splits"], r.get("split_kv_ratio")): r["us"] for r in _log_rows(RUN / "solve" / "qwen35-w4096.log")}
    out.append(f"{5 * sliding[(16, None)] + full[(16, None)]:.1f} µs by default, "
               f"{5 * sliding[(32, None)] + full[(32, None)]:.1f} µs with 32 window programs")
    return out


def _profile(name: str, sub: str = "hybrid") -> dict:
    return json.loads((RUN / sub / "profile" / f"{name}.json").read_text())


GROUPS = {
    "gemm": lambda k: k.startswith("_skinny_gemm") or k.startswith("nvjet") or "cublas" in k.lower(),
    "fold_split": lambda k: k.startswith("_fold_split_kernel"),
    "gdn_verify": lambda k: k.startswith("_gdn_verify_kernel"),
    "fold_merge": lambda k: k.startswith("_fold_merge_kernel"),
    "eager": lambda k: k.startswith(("_add_rms_norm_kernel", "_rotate_heads_kernel", "_silu_mul_kernel",
                                     "void at::native::elementwise_kernel<128", "void at::native::index_elementwise")),
}


def _grouped(profile: dict) -> dict:
    """Device µs a round per group; the target's lm_head (the one cuBLAS call of 512-row tiles) apart."""
    out = {g: 0.0 for g in GROUPS} | {"lm_head": 0.0}
    for row in profile["top"]:
        k = row["kernel"]
        if k.startswith("nvjet_sm90_tst_512x"):
            out["lm_head"] += row["us_per_round"]
            continue
        for g, match in GROUPS.items():
            if match(k):
                out[g] += row["us_per_round"]
    return out


def profile_rows(sub: str = "hybrid") -> list[str]:
    """§2's table: per group the AR step's and the round's device µs and their difference."""
    ar, sd = _grouped(_profile("qwen35_9b_ar", sub)), _grouped(_profile("qwen35_9b_sd_fold_dv", sub))
    return [f"| {ar[g]:,.1f} | {sd[g]:,.1f} | {sd[g] - ar[g]:+,.1f} |" for g in ("gemm", "fold_split", "gdn_verify",
                                                                             "fold_merge", "eager", "lm_head")]


def _hybrid(sub: str) -> dict:
    data = json.loads((RUN / sub / "hybrid.json").read_text())
    return {r["row"]: r["p50_ms"] for r in data["rows"]} | {"ratio": data["headline"]["qwen35_9b_sd_fold_dv_over_ar_32768"]}


def round_rows() -> list[str]:
    """§2's and §3's rounds: call 1's AR step and round with the vocabulary, its floor; call 2's three rounds."""
    one = _hybrid("hybrid")
    out = [f"AR {one['our_ar']:.3f} ms",
           f"round {one['our_sd_fold_dv']:.3f} ms = **{one['ratio']:.3f} AR steps**",
           f"its byte floor {one['floor_sd_fold_dv']:.3f} ms"]
    rows = [_hybrid(f"solve/hybrid-{v}") for v in ("default", "blocks", "blocks-reads")]
    out.append(" / ".join(f"{r['our_ar']:.3f}" for r in rows) + " ms")
    out.append(f"**{rows[0]['our_sd_fold_dv']:.3f} ms (rows, {rows[0]['ratio']:.4f} AR steps), "
               f"{rows[1]['our_sd_fold_dv']:.3f} ms (blocks, {rows[1]['ratio']:.4f}), "
               f"{rows[2]['our_sd_fold_dv']:.3f} ms (blocks + 32 window")
    nopdl = _hybrid("nopdl/nopdl")
    out.append(f"round {nopdl['our_sd_fold_dv']:.3f} ms, AR {nopdl['our_ar']:.3f} ms")
    return out


def gdn_rows() -> list[str]:
    """§3's verify-alone table from gdn_quick.py's lines (one block per solve)."""
    text = (RUN / "solve" / "gdn_quick.log").read_text()
    blocks = text.split("solve=blocks")
    pat = r"L=(\d+): before ([\d.]+) us .*?now ([\d.]+) us"
    rows_, blocks_ = (dict((int(L), (b, n)) for L, b, n in re.findall(pat, part)) for part in blocks)
    assert float(blocks_[16][1]) < float(rows_[16][1])  # the README's "faster alone" at 16 rows
    return [f"| {L} | {rows_[L][0]} / {blocks_[L][0]} | {rows_[L][1]} | " for L in (16, 64)] + [
        f"**{blocks_[16][1]}**"]


def by_rows_rows() -> list[str]:
    """§4: group 1's rounds by running rows, the ratios quoted, the decode phases."""
    g1 = json.loads((RUN / "batched" / "anatomy-group1.json").read_text())["systems"]
    fold, dv, ar = g1["fold-a2"]["by_running_rows"], g1["fold-a2+dv"]["by_running_rows"], g1["ar"]["by_running_rows"]
    cells = lambda parts: " | ".join(f"{parts[a]['round']:.3f} ({parts[a]['rounds']})" for a in ("1", "2", "6", "8"))
    out = [f"| FOLD α=2 (rounds at this A) | {cells(fold)} | {ar['8']['round']:.3f} ({ar['8']['rounds']}) |",
           "| FOLD + draft vocabulary | " + " | ".join(f"{dv[a]['round']:.3f} ({dv[a]['rounds']})"
                                                    for a in ("1", "2", "6", "8")) + " | |",
           f"{fold['8']['draft']:.3f} / {fold['8']['verify']:.3f} / {fold['8']['other']:.3f} | "
           f"{ar['8']['draft']:.3f} / {ar['8']['verify']:.3f} / {ar['8']['other']:.3f}",
           f"**{fold['8']['round'] / ar['8']['round']:.2f} batched AR steps**",
           f"**{fold['8']['round'] / fold['1']['round']:.2f} rounds of one row**",
           f"{fold['8']['draft'] / fold['1']['draft']:.1f}× a one-row draft and its verify "
           f"{fold['8']['verify'] / fold['1']['verify']:.1f}×",
           f"FOLD {g1['ar']['decode_s'] / g1['fold-a2']['decode_s']:.2f}×, with the vocabulary "
           f"{g1['ar']['decode_s'] / g1['fold-a2+dv']['decode_s']:.2f}× batched AR"]
    g4 = [json.loads(line) for line in (RUN / "batched" / "g4.log").read_text().splitlines() if line.startswith("{")]
    g4fold = next(r["fold-a2"] for r in g4 if "fold-a2" in r)["by_running_rows"]
    out.append(", ".join(f"{g4fold[a]['rounds']} at A = {a} ({g4fold[a]['round']:.3f} ms)" for a in ("1", "2", "8")))
    return out


def tier1k_rows() -> list[str]:
    """§5: mean τ per kind and pooled at 1,024 tokens, dflash and fold-a2, and the speed per token."""
    runs = [json.loads(line) for line in (RUN / "tier1k" / "runs.jsonl").read_text().splitlines()]
    assert {r["tier"] for r in runs} == {1024}
    by: dict = {}
    for r in runs:
        by.setdefault(r["request"], {})[r["method"]] = r
    assert len(by) == 48
    out = []
    for kind in ("c", "logs", "markup", "prose", "python", "structured"):
        reqs = [q for q in by.values() if q["dflash"]["suite"] == f"mixed-{kind}"]
        assert len(reqs) == 8
        mean = lambda m: sum(q[m]["tau"] for q in reqs) / len(reqs)
        out.append(f"| {kind} | {mean('dflash'):.2f} | {mean('fold-a2'):.2f} |")
    mean = lambda m: sum(q[m]["tau"] for q in by.values()) / len(by)
    out.append(f"| **all (48)** | **{mean('dflash'):.2f}** | **{mean('fold-a2'):.2f}** |")
    speed = lambda m: sum(q["ar"]["tpot_s"] / q[m]["tpot_s"] for q in by.values()) / len(by)
    out.append(f"dflash {speed('dflash'):.2f}×, FOLD {speed('fold-a2'):.2f}× AR")
    return out


def test_every_table_of_the_readme_is_what_the_files_say():
    readme = (RUN / "README.md").read_text()
    missing = [line for rows in (tile_rows(), split_rows(), profile_rows(), round_rows(), gdn_rows(), by_rows_rows(),
                                 tier1k_rows()) for line in rows if line not in readme]
    assert not missing, "\n".join(missing)


def test_the_profile_without_pdl_shows_the_same_verify():
    """§2's closing claim: the 16-row Gated DeltaNet verify costs the same a round with PDL off."""
    on, off = _grouped(_profile("qwen35_9b_sd_fold_dv")), _grouped(_profile("qwen35_9b_sd_fold_dv", "nopdl/nopdl"))
    assert abs(off["gdn_verify"] - on["gdn_verify"]) < 0.02 * on["gdn_verify"]
    assert f"GDN verify {off['gdn_verify']:.1f} µs a round" in (RUN / "README.md").read_text()


if __name__ == "__main__":
    for rows in (tile_rows(), split_rows(), profile_rows(), round_rows(), gdn_rows(), by_rows_rows(), tier1k_rows()):
        print("\n".join(rows), end="\n\n")
