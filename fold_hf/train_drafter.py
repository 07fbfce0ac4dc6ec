"""`fold-hf train-drafter`: train a DFlash drafter for a Hugging Face target, short, as released drafters are.

Data: windows of real text and code (training sources only, see :mod:`fold_hf.data`) continued greedily
by the target itself, so the drafter learns the target's own behaviour; code continuations copy
identifiers and lines from the window, which teaches the drafter to read its context. Sequences stay
within ``prompt_tokens + new_tokens <= 1024``, so long contexts are outside the drafter's training
range, as with released drafters.

Objective: :func:`fold_hf.training.dflash_loss` (random anchors inside the generated part; block
``[anchor, mask...]``; slot k predicts token ``anchor + k``; weights ``exp(-(k-1)/gamma)``; context
strictly before the anchor).

Runs resume: generated data is stored once (``data.pt``), training state every ``save_every`` steps
(``state.pt``), so a sweep can be split across 10-minute jobs (``--max-minutes``).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .embedded import trained_distance
from .modeling.drafter import FoldDrafter
from .modeling.drafter_config import FoldDrafterConfig, default_target_layer_ids
from .modeling.fold_config import FoldConfig
from .modeling.validation import target_text_config
from .targets.taps import HiddenTaps
from .training import dflash_loss, sample_anchors, spread_positions


@dataclass
class TrainSettings:
    """A training run's settings; the defaults are the committed SmolLM2 drafter's recipe (its model card), except
    ``intermediate_size`` (None: the target's) and ``mask_token_id`` (None: the last vocabulary id).
    ``bos_token_id``: every prompt window starts with this token (its ``prompt_tokens`` include it), for targets
    trained with BOS first (Gemma)."""

    layers: int = 6
    block_size: int = 8
    intermediate_size: int | None = None
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    prompt_tokens: int = 512
    new_tokens: int = 256
    sequences: int = 16384
    gen_batch: int = 512
    steps: int = 10000
    batch: int = 32
    anchors: int = 48
    lr: float = 6e-4
    warmup: int = 300
    gamma: float = 4.0
    seed: int = 0
    save_every: int = 250
    log_every: int = 10
    init_from: str | None = None
    bos_token_id: int | None = None
    kl: float = 0.0  # weight of the distillation term (dflash_loss's kl): KL to the target's distribution per slot
    mix_weights: dict | None = None  # per-kind window weights when the sources are a data mix (None: the defaults)
    # PoSE: spread each window's rope positions over this many (None: 0 .. L - 1), training.spread_positions
    position_span: int | None = None
    extra: dict = field(default_factory=dict)


def drafter_config_for(target, settings: TrainSettings) -> FoldDrafterConfig:
    tcfg = target_text_config(target)
    n_target = tcfg.num_hidden_layers
    taps = settings.target_layer_ids or default_target_layer_ids(n_target, settings.layers)
    heads = tcfg.num_attention_heads
    head_dim = getattr(tcfg, "head_dim", None) or tcfg.hidden_size // heads
    mask_id = settings.mask_token_id if settings.mask_token_id is not None else tcfg.vocab_size - 1
    rope = dict(getattr(tcfg, "rope_parameters", None) or {"rope_type": "default",
                                                          "rope_theta": getattr(tcfg, "rope_theta", 10000.0)})
    if "full_attention" in rope and isinstance(rope["full_attention"], dict):
        # per-layer-type parameters (targets mixing sliding and full layers, e.g. Gemma-3): the drafter's layers
        # attend to the whole context, so they take the full-attention layers' rope
        rope = dict(rope["full_attention"])
    return FoldDrafterConfig(
        block_size=settings.block_size, num_target_layers=n_target, target_layer_ids=list(taps),
        mask_token_id=mask_id, vocab_size=tcfg.vocab_size, hidden_size=tcfg.hidden_size,
        intermediate_size=settings.intermediate_size or tcfg.intermediate_size, num_hidden_layers=settings.layers,
        num_attention_heads=heads, num_key_value_heads=tcfg.num_key_value_heads, head_dim=head_dim,
        rms_norm_eps=getattr(tcfg, "rms_norm_eps", 1e-6), hidden_act=getattr(tcfg, "hidden_act", "silu"),
        max_position_embeddings=settings.prompt_tokens + settings.new_tokens, rope_parameters=rope,
    )


def token_windows(tokenizer, sources: list[str], count: int, length: int, seed: int,
                  bos_token_id: int | None = None) -> torch.Tensor:
    """``[count, length]`` random windows of the tokenized sources (documents too short are skipped);
    with ``bos_token_id`` each row is that token followed by ``length - 1`` tokens of a window."""
    rng = random.Random(seed)
    encoded = []
    for text in sources:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > length:
            encoded.append(ids)
    if not encoded:
        raise ValueError(f"no source document is longer than {length} tokens")
    weights = [len(ids) for ids in encoded]
    rows = []
    for _ in range(count):
        ids = rng.choices(encoded, weights=weights)[0]
        start = rng.randrange(0, len(ids) - length)
        row = ids[start : start + length]
        rows.append(row if bos_token_id is None else [bos_token_id] + row[1:])
    return torch.tensor(rows, dtype=torch.long)


@torch.no_grad()
def generate_training_data(target, prompts: torch.Tensor, new_tokens: int, batch: int) -> torch.Tensor:
    """Greedy continuations of equal-length prompts, ``[n, P + new_tokens]`` (EOS-padded after an EOS)."""
    device = next(target.parameters()).device
    out = []
    for start in tqdm(range(0, len(prompts), batch), desc="target continuations", unit="batch"):
        chunk = prompts[start : start + batch].to(device)
        gen = target.generate(chunk, attention_mask=torch.ones_like(chunk), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False)
        out.append(gen[:, : chunk.shape[1] + new_tokens].cpu())
    return torch.cat(out)


def load_training_data(files: list[str | Path], prompt_tokens: int, new_tokens: int) -> torch.Tensor:
    """Concatenate data generated elsewhere (``data.pt`` of ``--generate-only`` runs, e.g. one per GPU)."""
    parts = []
    for f in files:
        part = torch.load(f)
        if part.ndim != 2 or part.shape[1] != prompt_tokens + new_tokens:
            raise ValueError(f"{f}: data of shape {tuple(part.shape)}, settings ask for [n, {prompt_tokens} + "
                             f"{new_tokens}] (--prompt-tokens/--new-tokens must match the generating run)")
        parts.append(part)
    if not parts:
        raise ValueError("no data files given")
    return torch.cat(parts)


def prepare_training_data(target, tokenizer, out: Path, sources: list, settings: TrainSettings,
                          data_files: list[str | Path] | None = None) -> torch.Tensor:
    """The run's ``[n, P + N]`` training tokens: given files, else ``out/data.pt``, else generated and stored.

    ``sources``: texts (:func:`token_windows`) or the documents of a data mix (:func:`fold_hf.data.mix.mix_windows`,
    kinds weighted by ``settings.mix_weights``)."""
    if data_files:
        return load_training_data(data_files, settings.prompt_tokens, settings.new_tokens)
    data_file = out / "data.pt"
    if data_file.is_file():
        return torch.load(data_file)
    if sources and not isinstance(sources[0], str):  # documents of a data mix (fold_hf.data.mix.Doc)
        from .data.mix import mix_windows

        prompts = mix_windows(tokenizer, sources, settings.sequences, settings.prompt_tokens, settings.seed,
                              settings.mix_weights, settings.bos_token_id)
    else:
        prompts = token_windows(tokenizer, sources, settings.sequences, settings.prompt_tokens, settings.seed,
                                settings.bos_token_id)
    data = generate_training_data(target, prompts, settings.new_tokens, settings.gen_batch)
    torch.save(data, data_file)
    return data


def train_drafter(target, tokenizer, out_dir: str | Path, sources: list, settings: TrainSettings,
                  held_out: list[str] | None = None, max_minutes: float | None = None,
                  log=print, data_files: list[str | Path] | None = None, generate_only: bool = False,
                  card: dict | None = None, time_budget: float | None = None) -> dict:
    """Train (or resume) a drafter for ``target``; writes the z-lab layout into ``out_dir`` when done.

    ``card``: ``{"target": name, "licence": line, "data": description}`` for the model card (``README.md``
    beside the weights, :func:`write_model_card`).

    ``data_files``: train on these pre-generated ``[n, P + N]`` tensors (concatenated) instead of generating;
    ``generate_only``: generate ``out_dir/data.pt`` and return without training (to split generation over GPUs).
    ``time_budget``: minutes of optimizer steps for the whole run, over all resumed calls: after a short probe the
    step count is cut to what fits (never raised above ``settings.steps``), so the cosine schedule ends, and the
    held-out τ is measured, within the budget. The chosen count and the time spent are kept in ``state.pt``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    device = next(target.parameters()).device
    torch.manual_seed(settings.seed)

    data = prepare_training_data(target, tokenizer, out, sources, settings, data_files)
    log(f"training data: {tuple(data.shape)} tokens ({time.time() - started:.0f}s)")
    if generate_only:
        return {"generated": list(data.shape), "data": str(out / "data.pt"), "minutes": (time.time() - started) / 60}

    if settings.init_from:
        # warm start: continue a finished drafter on new data (its architecture, not the settings', decides the shape)
        start_from = FoldDrafter.from_pretrained(settings.init_from, dtype=torch.float32)
        config = start_from.config
        if config.block_size != settings.block_size:
            raise ValueError(f"--init-from drafter has block size {config.block_size}, settings ask for "
                             f"{settings.block_size}")
        drafter = FoldDrafter(config, FoldConfig(mode="dflash"))
        drafter.load_state_dict(start_from.state_dict())
        drafter = drafter.to(device=device, dtype=torch.float32)
        del start_from
        log(f"warm start from {settings.init_from}")
    else:
        config = drafter_config_for(target, settings)
        drafter = FoldDrafter(config, FoldConfig(mode="dflash")).to(device=device, dtype=torch.float32)
    drafter.bind_target(target)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.01)
    step = 0
    train_seconds = 0.0  # time spent in optimizer steps, over every call of this run
    fitted = False  # the step count has been fitted to time_budget
    state_file = out / "state.pt"
    if state_file.is_file():
        state = torch.load(state_file, map_location=device)
        drafter.load_state_dict(state["drafter"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        train_seconds = state.get("train_seconds", 0.0)
        if state.get("steps") is not None:
            settings.steps, fitted = state["steps"], True
        log(f"resumed at step {step} of {settings.steps}")
    if time_budget is not None and time_budget <= 0:
        raise ValueError(f"time_budget must be positive minutes, got {time_budget}")
    probe_from, probe_steps = None, 20

    def lr_at(s: int) -> float:
        if s < settings.warmup:
            return settings.lr * (s + 1) / settings.warmup
        progress = (s - settings.warmup) / max(1, settings.steps - settings.warmup)
        return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    taps = HiddenTaps(target, config.target_layer_ids)
    gen = torch.Generator().manual_seed(settings.seed + step)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)
    bar = tqdm(total=settings.steps, initial=step, desc="train drafter", unit="step")
    history = []

    def save_state():
        torch.save({"drafter": drafter.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                    "steps": settings.steps if fitted else None, "train_seconds": train_seconds}, state_file)

    drafter.train()
    finished = True
    loop_started = time.time()
    while step < settings.steps:
        if max_minutes is not None and (time.time() - started) / 60 > max_minutes:
            log(f"time limit: stopping at step {step} after {max_minutes} minutes; run again to resume")
            finished = False
            break
        if time_budget is not None and not fitted:
            # probe: time probe_steps steps after 5 warm ones, then fit the schedule into what is left
            if step >= 5 and probe_from is None:
                _sync(device)
                probe_from = (time.time(), step)
            elif probe_from is not None and step - probe_from[1] >= probe_steps:
                _sync(device)
                per_step = (time.time() - probe_from[0]) / (step - probe_from[1])
                left = time_budget * 60 - train_seconds - (time.time() - loop_started)
                settings.steps = max(step + 1, min(settings.steps, step + int(left / per_step)))
                settings.warmup = min(settings.warmup, max(1, settings.steps // 10))
                fitted = True
                bar.total = settings.steps
                log(f"time budget {time_budget} min: {per_step * 1000:.0f} ms per step, {settings.steps} steps "
                    f"(warm-up {settings.warmup})")
        rows = torch.randint(0, len(data), (settings.batch,), generator=gen)
        batch = data[rows].to(device)
        with torch.no_grad(), taps:
            out_t = target(batch)
        target_logits = out_t.logits if settings.kl else None  # [b, L, V], only for the distillation term
        del out_t
        features = taps.features()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        anchors = torch.stack([sample_anchors(batch.shape[1], settings.block_size, settings.anchors, generator=gen,
                                              min_context=settings.prompt_tokens - 1)
                               for _ in range(settings.batch)]).to(device)
        positions = None
        if settings.position_span:
            positions = spread_positions(batch.shape[1], settings.position_span, settings.batch, gen).to(device)
        optimizer.zero_grad(set_to_none=True)
        # the whole batch in one drafter forward: a per-sequence loop was launch-bound on the H200 (3.6 steps/s
        # for batch 8 of a 4-layer drafter)
        with autocast:
            loss, info = dflash_loss(drafter, features, batch, anchors, settings.gamma, target_logits, settings.kl,
                                     positions)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % settings.log_every == 0 or step == settings.steps:
            total = loss.item()  # host reads only every log_every steps
            slot_acc = info["accuracy"].tolist()
            history.append(total)
            bar.set_postfix(loss=f"{total:.3f}", acc1=f"{slot_acc[0]:.2f}")
        bar.update(1)
        if step % settings.save_every == 0:
            save_state()
    bar.close()
    train_seconds += time.time() - loop_started
    save_state()
    drafter.eval()
    drafter = drafter.to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    # final_loss: mean of the last 5 logged losses (one every log_every steps)
    report = {"finished": finished, "step": step, "minutes": (time.time() - started) / 60,
              "train_minutes": train_seconds / 60,
              "final_loss": sum(history[-5:]) / max(1, len(history[-5:])), "loss_every": settings.log_every,
              "data": {"sequences": len(data), "files": [str(f) for f in data_files or []]}}
    # the saved preset's training length R (YaRN's reference, ReRoPE's) is the span of positions the drafter saw
    drafter.set_fold_config(FoldConfig(mode="dflash", train_length=trained_distance(
        settings.prompt_tokens, settings.new_tokens, settings.position_span)))

    def write_drafter():  # weights, training.json and the model card, as the report stands
        (out / "drafter").mkdir(parents=True, exist_ok=True)
        (out / "drafter" / "training.json").write_text(json.dumps({"settings": asdict(settings), "report": report},
                                                                  indent=2))
        write_model_card(out / "drafter", drafter, settings, report, card or {})

    # the weights are written before the held-out read (minutes on a GPU): a call killed during the read still leaves
    # the trained drafter (its card then says held-out τ was not measured)
    drafter.save_pretrained(out / "drafter")
    write_drafter()
    if held_out and finished:  # a stopped run is measured when it finishes
        report["held_out"] = evaluate_tau(target, tokenizer, drafter, held_out, settings, seed=settings.seed + 1)
        log(f"held-out tau: {report['held_out']}")
        write_drafter()
    return report


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def write_model_card(directory: Path, drafter: FoldDrafter, settings: TrainSettings, report: dict, card: dict) -> Path:
    """``directory/README.md``: what the drafter is, its recipe (the exact settings), held-out τ and the licence
    note of its target (a drafter trained on a target's outputs inherits the target's terms where they say so)."""
    cfg = drafter.config
    own = sum(p.numel() for p in drafter.parameters())
    target = card.get("target", "its target")
    held = report.get("held_out") or {}
    lines = [
        f"# DFlash drafter for {target} (trained by `fold-hf train-drafter`)",
        "",
        f"A {cfg.num_hidden_layers}-layer block-parallel (DFlash) drafter in the z-lab checkpoint layout, loadable with "
        f"`FoldDrafter.from_pretrained`; it uses the target's embedding and `lm_head` ({own / 1e6:.2f} M parameters "
        f"of its own).",
        "",
        "| field | value |", "|---|---|",
        f"| layers / hidden / heads (KV) / head dim / MLP | {cfg.num_hidden_layers} / {cfg.hidden_size} / "
        f"{cfg.num_attention_heads} ({cfg.num_key_value_heads}) / {cfg.head_dim} / {cfg.intermediate_size} |",
        f"| block size B | {cfg.block_size} |",
        f"| tapped target layers | {', '.join(map(str, cfg.target_layer_ids))} (of {cfg.num_target_layers}) |",
        f"| mask token | {cfg.mask_token_id} |",
        f"| training length | {settings.prompt_tokens + settings.new_tokens} tokens ({settings.prompt_tokens} real "
        f"tokens{' starting with BOS' if settings.bos_token_id is not None else ''} + {settings.new_tokens} the "
        f"target generated)"
        + (f"; rope positions spread over {settings.position_span} (PoSE) |" if settings.position_span else " |"),
        f"| held-out τ (dflash, greedy) | "
        + (f"{held['tau_mean']:.2f} on {held['requests']} windows of {held['prompt_tokens']} tokens, "
           f"{held['new_tokens']} new tokens ({held['identical_to_ar']} outputs identical to AR) |" if held
           else "not measured (" + ("run stopped before its last step" if not report.get("finished")
                                   else "the held-out read did not complete") + ") |"),
        "",
        "## Licence",
        "",
        card.get("licence", "See the target's licence."),
        "",
        "## Recipe",
        "",
        f"- Data: {card.get('data', 'target continuations of real text')}; {report['data']['sequences']} sequences"
        + (f" from {', '.join(report['data']['files'])}" if report['data']['files'] else "") + ".",
        f"- Objective: DFlash (random anchors in the generated part, {settings.anchors} per sequence, block "
        f"`[anchor, mask x {settings.block_size - 1}]`, slot k predicts token anchor+k, loss weight "
        f"`exp(-(k-1)/{settings.gamma:g})`, context strictly before the anchor), AdamW (lr {settings.lr:g}, betas "
        f"0.9/0.95, wd 0.01, {settings.warmup} warm-up steps, cosine to 10%), batch {settings.batch}, seed "
        f"{settings.seed}."
        + (f" Plus {settings.kl:g} x KL(target || drafter) per block slot (distillation against the target's "
           f"distribution)." if settings.kl else ""),
        *([f"- Rope positions spread over {settings.position_span} (PoSE): each window is cut at a random point and "
           f"its second part moved by a random skip, so the drafter saw distances up to {settings.position_span - 1} "
           f"without reading more than {settings.prompt_tokens + settings.new_tokens} tokens."]
          if settings.position_span else []),
        *([f"- Warm start from `{settings.init_from}` (its weights, a fresh optimizer)."] if settings.init_from else []),
        f"- {report['step']} of {settings.steps} steps; final training loss {report['final_loss']:.3f}.",
        "",
        "The exact settings and report are in `training.json`.",
        "",
    ]
    path = Path(directory) / "README.md"
    path.write_text("\n".join(lines))
    return path


@torch.no_grad()
def evaluate_tau(target, tokenizer, drafter, texts: list[str], settings: TrainSettings, requests: int = 16,
                 new_tokens: int = 128, seed: int = 1) -> dict:
    """Mean τ of greedy speculative decoding on held-out windows of ``settings.prompt_tokens`` tokens."""
    from .generation.loop import generate

    device = next(target.parameters()).device
    prompts = token_windows(tokenizer, texts, requests, settings.prompt_tokens, seed, settings.bos_token_id)
    taus = []
    same = 0
    for row in tqdm(prompts, desc="held-out tau", unit="req"):
        ids = row[None].to(device)
        res = generate(target, drafter, input_ids=ids, max_new_tokens=new_tokens, return_stats=True,
                       fold_config=FoldConfig(mode="dflash"))
        ar = generate(target, None, input_ids=ids, max_new_tokens=new_tokens)
        same += int(torch.equal(res.sequences, ar))
        taus.append(res.tau)
    return {"requests": len(taus), "prompt_tokens": settings.prompt_tokens, "new_tokens": new_tokens,
            "tau_mean": sum(taus) / len(taus), "identical_to_ar": same}
