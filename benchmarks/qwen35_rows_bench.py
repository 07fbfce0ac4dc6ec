"""The Qwen3.5 family's batched verify (issue 35): one host-length ``forward_rows`` of ``B`` rows of ``W`` tokens and
the ``accept`` of a different count per row, at the Qwen3.5-9B text shape with random weights (bf16, CUDA), with the
linear layers' two ways of leaving each row's state at its accepted position (fold_hf/targets/qwen35_rows.py):

* ``writes``: the fused Gated DeltaNet verify per row keeps the block's writes ``d_t`` (16 KiB a token and layer),
  the commit replays each row's accepted prefix into its state (the default for blocks of up to 64 tokens);
* ``states``: every row's state after every block position is kept (``W x 2 MiB`` per row and layer at this shape)
  and ``accept`` copies the chosen one (what a block of more than 64 tokens does; ``FUSED_MAX_ROWS`` set to 0 here);
* ``fused``: the fused layers over rows (``forward_rows_static``, replayed as a CUDA graph, what the graphs engine
  does for a batch), then ``after_rows_step`` and the per-row commit.

    python benchmarks/qwen35_rows_bench.py --context 32768 --rows 1,2,4,8 --width 16 --out DIR

The rows' caches are not prefilled (a verify's cost depends on the shapes only; rows at contexts
``context - 37 a``). Prints and writes (``DIR/qwen35_rows.csv`` / ``.json``) per (B, way): milliseconds per
verify + accept (mean of ``--repeats`` after 3 warm-ups, synchronised), peak memory, and how far the two ways'
logits and committed states are apart (the same rule; the chunked verify's dots round differently in fp32).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemma_rows_bench import milliseconds  # noqa: E402
from hybrid_bench import qwen35_config  # noqa: E402

import fold_hf.targets.qwen35_rows as qwen35_rows  # noqa: E402
from fold_hf.generation.graphs import CapturedStep  # noqa: E402
from fold_hf.targets.base import bucket_length  # noqa: E402
from fold_hf.targets.qwen35 import Qwen35StaticTarget  # noqa: E402


@torch.no_grad()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--width", type=int, default=16, help="verify block width W (1 + proposals)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="a tiny fp32 shape on this device (a smoke run)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.tiny:
        raise SystemExit("the 9B shape needs CUDA (--tiny runs a small shape on the CPU)")
    from transformers import Qwen3_5ForCausalLM

    cfg = qwen35_config(args.tiny, args.context + 256)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3_5ForCausalLM._from_config(cfg, dtype=torch.float32 if args.tiny else torch.bfloat16).eval()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ctx, W = args.context, args.width
    rows_out = []
    for B in (int(b) for b in args.rows.split(",")):
        runner = Qwen35StaticTarget(model, ctx + 128, batch=B)
        g = torch.Generator(device="cpu").manual_seed(B)
        for t in runner._recurrent_rows_all, runner._conv_rows_all:  # a committed state of the right scale
            t.copy_((torch.randn(t.shape, generator=g) * 0.05).to(t.dtype))
        initial = (runner._recurrent_rows_all.clone(), runner._conv_rows_all.clone())

        def reset():  # every way starts from the same committed states
            runner._recurrent_rows_all.copy_(initial[0])
            runner._conv_rows_all.copy_(initial[1])

        starts = [max(1, ctx - 37 * a) for a in range(B)]
        ids = torch.randint(0, min(1000, cfg.vocab_size), (B, W), generator=g).to(device)
        rows = list(range(B))
        counts = [(5 * a + 3) % W for a in range(B)]
        results = {}
        positions = torch.tensor(starts, device=device)[:, None] + torch.arange(W, device=device)
        bucket = bucket_length(max(starts) + W, runner.capacity)
        default = qwen35_rows.FUSED_MAX_ROWS
        ways = (("writes", default), ("states", 0), ("fused", default))
        for way, limit in ways:
            qwen35_rows.FUSED_MAX_ROWS = limit
            if way == "fused":  # (eager off CUDA, the fused ops' twins: a smoke run)
                def rows_step():
                    return runner.forward_rows_static(ids, positions, rows, bucket)

                step = CapturedStep(rows_step, preserve=runner.step_state()) if device == "cuda" else None

                def forward():
                    out = step.replay() if step is not None else rows_step()
                    runner.after_rows_step(rows, W)
                    return out
            else:
                def forward():
                    return runner.forward_rows(ids, rows, starts)

            def call():
                forward()
                runner.accept(counts)

            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            ms = milliseconds(call, args.repeats) if device == "cuda" else float("nan")
            peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
            reset()
            logits = forward().float()
            runner.accept(counts)
            results[way] = (logits, runner._recurrent_rows_all.clone(), runner._conv_rows_all.clone())
            reset()
            sync()
            rows_out.append({"rows": B, "width": W, "context": ctx, "way": way, "ms": round(ms, 4),
                             "peak_gib": round(peak, 3)})
        qwen35_rows.FUSED_MAX_ROWS = default
        ls, ss, cs = results["states"]  # the rows' gaps to the per-position states' way
        mine = rows_out[-len(ways):]
        for r in mine:
            lw, sw, cw = results[r["way"]]
            r.update({"logits_max_abs_diff": float((lw - ls).abs().max()),
                      "argmax_agree": float((lw.argmax(-1) == ls.argmax(-1)).float().mean()),
                      "state_max_abs_diff": float((sw - ss).abs().max()), "state_scale": float(ss.abs().max()),
                      "conv_max_abs_diff": float((cw.float() - cs.float()).abs().max())})
        states_ms = next(r["ms"] for r in mine if r["way"] == "states")
        print(f"ctx {ctx} B={B} W={W}: " + "; ".join(
            f"{r['way']} {r['ms']:.3f} ms (/states {r['ms'] / states_ms:.3f}, peak {r['peak_gib']:.2f} GiB, logits "
            f"diff {r['logits_max_abs_diff']:.3g}, argmax agree {r['argmax_agree']:.3f}, state diff "
            f"{r['state_max_abs_diff']:.3g} of {r['state_scale']:.3g})" for r in mine), flush=True)
        del runner
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "qwen35_rows.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows_out[0]))
            writer.writeheader()
            writer.writerows(rows_out)
        meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if device == "cuda" else
                platform.processor(), "torch": torch.__version__, "argv": sys.argv[1:]}
        import transformers

        meta["transformers"] = transformers.__version__
        (args.out / "qwen35_rows.json").write_text(json.dumps({"meta": meta, "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
