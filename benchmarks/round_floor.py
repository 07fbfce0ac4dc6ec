"""``sd_round_over_round_floor_8b_32k`` for a ``last_mile.json`` written before the bench computed it (issue 33):
the SD ``fold`` round's p50 over its own byte floor (the AR floor's target weights + KV, plus the drafter's weights,
the target's lm_head read again and the drafter's cache, :func:`last_mile_bench.round_floor_ms`), at the run's own
measured copy bandwidth. The pair is built on the meta device (shapes only: no GPU, no memory).

    python benchmarks/round_floor.py benchmarks/results/2026-12-02-nvidia-h200-merge/final/last_mile.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from last_mile_bench import drafter_facts, round_floor_ms, shape_facts  # noqa: E402


def meta_pair():
    """The Llama-3.1-8B-shape target and 5-layer drafter of ``e2e_bench.build_random_pair``, on the meta device."""
    from e2e_bench import build_random_pair

    return build_random_pair(4096, device="meta")


def main(path: str) -> dict:
    report = json.loads(Path(path).read_text())
    target, drafter = meta_pair()
    facts = {**shape_facts(target), **drafter_facts(target, drafter)}
    for name in ("weight_bytes_per_step", "kv_bytes_per_token"):
        assert facts[name] == report["facts"][name], (name, facts[name], report["facts"][name])  # the same shapes
    bandwidth = report["bandwidth_tb_s"] * 1e12
    rounds = [r for r in report["rows"] if r["row"] == "our_sd_fold" and r["context"] == 32768]
    ar = [r for r in report["rows"] if r["row"] == "our_ar" and r["context"] == 32768]
    floor = round_floor_ms(facts, 32768, bandwidth)
    ar_floor = (facts["weight_bytes_per_step"] + facts["kv_bytes_per_token"] * 32768) / bandwidth * 1e3
    out = {"round_floor_ms_32k": round(floor, 4), "ar_floor_ms_32k": round(ar_floor, 4),
           "round_floor_over_ar_floor": round(floor / ar_floor, 4),
           "sd_round_ms_32k": rounds[0]["p50_ms"], "ar_step_ms_32k": ar[0]["p50_ms"],
           "sd_round_over_round_floor_8b_32k": round(rounds[0]["p50_ms"] / floor, 4),
           "drafter_facts": {k: facts[k] for k in ("drafter_bytes_per_round", "drafter_kv_bytes_per_token")}}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(sys.argv[1])
