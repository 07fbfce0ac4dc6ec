"""Why is a speculative round slow in fp32 on the GPU? Times and profiles AR and fold on one real request."""
import json, os, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
from fold_hf import FoldConfig
from fold_hf.cli import load_default_pair
from fold_hf.generation import fast_generate

out = sys.argv[1]
req = json.loads(open(".gpu/realpair-requests.jsonl").readline())
ids = torch.tensor([req["input_ids"]], device="cuda")
cfg = FoldConfig(mode="fold", window=512, alpha=2.0, train_length=768)
report = {}
for dtype in (torch.float32, torch.bfloat16):
    target, _, drafter = load_default_pair(torch.device("cuda"), None, dtype)
    name = str(dtype).split(".")[-1]
    for label, d in (("ar", None), ("fold", drafter)):
        kw = dict(input_ids=ids, max_new_tokens=64, eos_token_id=[], fold_config=cfg if d is not None else None)
        fast_generate(target, d, **kw)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = fast_generate(target, d, return_stats=True, **kw)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fast_generate(target, d, **kw)
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)
        cuda_table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=70)
        open(f"{out}/prof_{name}_{label}.txt", "w").write(table + "\n\n" + cuda_table)
        report[f"{name}_{label}"] = dict(wall_s=wall, tau=res.tau, tpot_ms=1000 * res.tpot_s, rounds=res.rounds)
        print(name, label, report[f"{name}_{label}"], flush=True)
    from fold_hf.generation import release_fast_state
    release_fast_state(target)
    del target, drafter
    torch.cuda.empty_cache()
json.dump(report, open(f"{out}/diag.json", "w"), indent=1)
