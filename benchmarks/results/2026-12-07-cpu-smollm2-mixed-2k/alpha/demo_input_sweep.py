import sys, torch, time
sys.path.insert(0, "/work/main")
torch.set_num_threads(2)
from fold_hf import FoldConfig, fast_generate
from fold_hf.pairs import load_pair
from fold_hf.commands import demo_prompt
target, tok, drafter = load_pair(device=torch.device("cpu"))
ids = demo_prompt(tok, 2048)
def tau(cfg, n=64):
    r = fast_generate(target, drafter, input_ids=ids, max_new_tokens=n, fold_config=cfg, return_stats=True, eos_token_id=[])
    a = r.acceptance_lengths
    return sum(a)/len(a)
for W in (256, 512, 768, 1024):
    for alpha in (1.0, 2.0, 4.0):
        t=time.time(); print(W, alpha, round(tau(FoldConfig(mode="fold", window=W, alpha=alpha)),3), f"{time.time()-t:.1f}s", flush=True)
print("window-only 512", tau(FoldConfig(mode="window", window=512)) if True else None)
