"""z-lab checkpoint layouts: load, round-trip, identical drafts, native transformers DFlash path, bad files."""

import json

import pytest
import torch
from safetensors.torch import save_file

import fold_hf
from fold_hf import FoldConfig, FoldDrafter
from fold_hf.modeling import default_target_layer_ids
from tiny import MASK_ID, greedy_reference, tiny_drafter, tiny_target


def zlab_config(target, layout: str, drafter_layers: int = 2, taps=(1, 3), rope: str = "theta", **extra):
    tcfg = target.config
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": tcfg.hidden_size,
        "intermediate_size": 64,
        "num_hidden_layers": drafter_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "vocab_size": tcfg.vocab_size,
        "max_position_embeddings": 4096,
        "num_target_layers": tcfg.num_hidden_layers,
        "torch_dtype": "float32",
    }
    if rope == "theta":
        cfg["rope_theta"] = 10000.0
        cfg["rope_scaling"] = None
    elif rope == "llama3":
        cfg["rope_theta"] = 10000.0
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
    else:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    dflash = {"mask_token_id": MASK_ID}
    if taps is not None:
        dflash["target_layer_ids"] = list(taps)
    if layout == "top":
        cfg["block_size"] = 4
    else:
        dflash["block_size"] = 4
    cfg["dflash_config"] = dflash
    cfg.update(extra)
    return cfg


def write_checkpoint(path, cfg, seed=0):
    """Weights written by hand with the released names (independent of FoldDrafter.save_pretrained)."""
    g = torch.Generator().manual_seed(seed)
    H, L, n_taps = cfg["hidden_size"], cfg["num_hidden_layers"], len(cfg["dflash_config"].get("target_layer_ids") or
                                                                    range(cfg["num_hidden_layers"]))
    hd, nh, nkv, inter = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    w = lambda *s: torch.randn(*s, generator=g) * 0.05  # noqa: E731
    state = {"fc.weight": w(H, n_taps * H), "hidden_norm.weight": 1 + w(H), "norm.weight": 1 + w(H)}
    for i in range(L):
        p = f"layers.{i}."
        state.update({
            p + "self_attn.q_proj.weight": w(nh * hd, H), p + "self_attn.k_proj.weight": w(nkv * hd, H),
            p + "self_attn.v_proj.weight": w(nkv * hd, H), p + "self_attn.o_proj.weight": w(H, nh * hd),
            p + "self_attn.q_norm.weight": 1 + w(hd), p + "self_attn.k_norm.weight": 1 + w(hd),
            p + "mlp.gate_proj.weight": w(inter, H), p + "mlp.up_proj.weight": w(inter, H),
            p + "mlp.down_proj.weight": w(H, inter),
            p + "input_layernorm.weight": 1 + w(H), p + "post_attention_layernorm.weight": 1 + w(H),
        })
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(state, str(path / "model.safetensors"))
    return state


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3", seed=7, dtype=torch.float32)


def drafts(drafter, target, ids, mode="fold"):
    return fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=24, return_stats=True,
                            fold_config=FoldConfig(mode=mode, window=8))


@pytest.mark.parametrize("layout", ["top", "nested"])
@pytest.mark.parametrize("rope", ["theta", "parameters", "llama3"])
def test_zlab_layouts_load_round_trip_and_draft_identically(tmp_path, target, layout, rope):
    cfg = zlab_config(target, layout, rope=rope)
    state = write_checkpoint(tmp_path / "ckpt", cfg)
    drafter = FoldDrafter.from_pretrained(tmp_path / "ckpt", fold_config=FoldConfig(window=8))
    assert drafter.block_size == 4 and drafter.config.mask_token_id == MASK_ID
    assert drafter.config.target_layer_ids == [1, 3]
    assert drafter.config._attn_implementation == "fold"
    for key, tensor in state.items():
        assert torch.equal(drafter.state_dict()[key], tensor)
    if rope == "llama3":
        assert drafter.config.rope_parameters["rope_type"] == "llama3"
    drafter.save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert written["architectures"] == ["DFlashDraftModel"]
    assert ("block_size" in written) == (layout == "top")
    assert ("block_size" in written["dflash_config"]) == (layout == "nested")
    reloaded = FoldDrafter.from_pretrained(tmp_path / "saved")
    assert reloaded.fold_config == FoldConfig(window=8)  # picked up from fold_config.json
    ids = torch.randint(0, MASK_ID, (1, 30), generator=torch.Generator().manual_seed(2))
    a, b = drafts(drafter, target, ids), drafts(reloaded, target, ids)
    assert torch.equal(a.sequences, b.sequences) and a.acceptance_lengths == b.acceptance_lengths
    with torch.no_grad():
        cache_a, cache_b = drafter.new_cache(), reloaded.new_cache()
        feats = torch.randn(1, 20, 2 * target.config.hidden_size)
        noise = torch.randn(1, 4, target.config.hidden_size)
        ha = drafter(noise, feats, cache=cache_a).last_hidden_state
        hb = reloaded(noise, feats, cache=cache_b).last_hidden_state
    assert torch.equal(ha, hb)


def test_missing_target_layer_ids_default_to_dflash_spread(tmp_path, target):
    cfg = zlab_config(target, "nested", drafter_layers=3, taps=None)
    write_checkpoint(tmp_path, cfg)
    drafter = FoldDrafter.from_pretrained(tmp_path)
    assert drafter.config.target_layer_ids == default_target_layer_ids(6, 3) == [1, 2, 3]
    assert default_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]
    assert default_target_layer_ids(30, 1) == [15]


def test_sliding_layer_types_are_read(tmp_path, target):
    cfg = zlab_config(target, "nested", layer_types=["sliding_attention", "full_attention"], sliding_window=6)
    write_checkpoint(tmp_path, cfg)
    drafter = FoldDrafter.from_pretrained(tmp_path)
    assert drafter.layers[0].self_attn.sliding_window == 6
    assert drafter.layers[1].self_attn.sliding_window is None
    drafter.save_pretrained(tmp_path / "again")
    assert FoldDrafter.from_pretrained(tmp_path / "again").layers[0].self_attn.sliding_window == 6


@pytest.mark.parametrize("mode", ["dflash", "fold"])
def test_native_transformers_dflash_path_is_lossless_and_reads_like_ours(tmp_path, target, mode):
    write_checkpoint(tmp_path, zlab_config(target, "nested"))
    drafter = FoldDrafter.from_pretrained(tmp_path, fold_config=FoldConfig(mode=mode, window=8))
    ids = torch.randint(0, MASK_ID, (1, 40), generator=torch.Generator().manual_seed(5))
    ref = greedy_reference(target, ids, 20)
    native = target.generate(ids, assistant_model=drafter, max_new_tokens=20, do_sample=False,
                             speculation_type="dflash")
    assert torch.equal(native, ref)
    # the drafter's native-signature forward (context + block in a DynamicCache) equals the FoldCache forward
    from transformers import DynamicCache

    feats = torch.randn(1, 30, 2 * target.config.hidden_size, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(1, 4, target.config.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        dyn = DynamicCache()
        drafter(noise, feats[:, :25], position_ids=torch.arange(29)[None], cache=dyn)
        dyn.crop(-4)
        native_h = drafter(noise, feats[:, 25:], position_ids=torch.arange(25, 34)[None], cache=dyn).last_hidden_state
        ours = drafter.new_cache()
        drafter(noise, feats[:, :25], cache=ours)
        ours_h = drafter(noise, feats[:, 25:], cache=ours).last_hidden_state
    assert torch.allclose(native_h, ours_h, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c.pop("num_target_layers"), "num_target_layers"),
        (lambda c: (c.pop("dflash_config"), c.pop("block_size", None)), "block_size"),
        (lambda c: c.update(architectures=["LlamaForCausalLM"]), "not a DFlash drafter"),
        (lambda c: c.pop("hidden_size"), "hidden_size"),
    ],
)
def test_bad_configs_name_the_field(tmp_path, target, mutate, message):
    cfg = zlab_config(target, "nested")
    write_checkpoint(tmp_path, cfg)
    mutate(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=message):
        FoldDrafter.from_pretrained(tmp_path)


def test_bad_weights_name_the_file_and_tensor(tmp_path, target):
    cfg = zlab_config(target, "nested")
    write_checkpoint(tmp_path, cfg)
    cfg["intermediate_size"] = 48  # config no longer matches the tensors
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model.safetensors.*mlp\.(gate|up|down)_proj"):
        FoldDrafter.from_pretrained(tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        FoldDrafter.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        FoldDrafter.from_pretrained(tmp_path)


def test_missing_tensor_is_reported(tmp_path, target):
    cfg = zlab_config(target, "nested")
    state = write_checkpoint(tmp_path, cfg)
    state.pop("layers.1.mlp.up_proj.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="layers.1.mlp.up_proj.weight"):
        FoldDrafter.from_pretrained(tmp_path)


def test_offline_hub_id_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="local directory"):
        FoldDrafter.from_pretrained("z-lab/not-here-fold-test")


def test_tiny_drafter_save_load_round_trip(tmp_path, target):
    drafter = tiny_drafter(target, fold_config=FoldConfig(mode="rerope", window=8))
    drafter.save_pretrained(tmp_path)
    again = FoldDrafter.from_pretrained(tmp_path)
    assert again.fold_config.mode == "rerope"
    for k, v in drafter.state_dict().items():
        assert torch.equal(again.state_dict()[k], v)
