"""Surviving transformers releases (issue 33): what we read of transformers' internals goes through
:mod:`fold_hf.compat`; the integration is installed explicitly (creating a FoldDrafter does it) and fails loudly when
a hook it wraps is gone; fast paths that cannot be used say so once; the hybrid-cache rollback follows the release.

These run on every transformers CI installs (the newest release, and 5.17 in the second environment of ``.ci/run``).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from tiny import oracle_tokens, tiny_drafter

import fold_hf
from fold_hf import FoldConfig, compat

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------- compat readers
def test_norm_epsilon_reads_either_name_and_fails_loudly_on_neither():
    class Old(torch.nn.Module):  # Gemma-3 / Qwen3.5 / Gemma-4 before 5.25
        eps = 1e-6

    class New(torch.nn.Module):  # Llama, Qwen3, Gemma-4 from 5.25
        variance_epsilon = 1e-5

    class Neither(torch.nn.Module):
        epsilon = 1e-6

    assert compat.norm_epsilon(Old()) == 1e-6 and compat.norm_epsilon(New()) == 1e-5
    assert compat.has_norm_epsilon(New()) and not compat.has_norm_epsilon(Neither())
    with pytest.raises(compat.UpstreamChanged, match="Neither has neither `variance_epsilon` nor `eps`"):
        compat.norm_epsilon(Neither())


def test_every_transformers_norm_class_of_our_families_has_a_readable_epsilon():
    """The norms the fused target layers read, built from this transformers' own classes."""
    from transformers.models.gemma3 import modeling_gemma3
    from transformers.models.llama import modeling_llama

    norms = [modeling_llama.LlamaRMSNorm(8, eps=1e-5), modeling_gemma3.Gemma3RMSNorm(8, eps=1e-6)]
    for module, name in (("qwen3_5", "Qwen3_5RMSNorm"), ("qwen3_5", "Qwen3_5RMSNormGated"), ("gemma4", "Gemma4RMSNorm")):
        try:
            mod = __import__(f"transformers.models.{module}.modeling_{module}", fromlist=[name])
        except ImportError:
            continue
        norms.append(getattr(mod, name)(8, eps=3e-6))
    for norm in norms:
        expected = 1e-5 if "Llama" in type(norm).__name__ else (1e-6 if "Gemma3" in type(norm).__name__ else 3e-6)
        assert compat.norm_epsilon(norm) == pytest.approx(expected), type(norm).__name__


# ---------------------------------------------------------------------------------------------- install
def _run_python(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_import_fold_hf_patches_nothing_and_a_drafter_installs_the_strategy():
    out = _run_python("""
        from transformers.generation.utils import GenerationMixin
        from transformers import AttentionInterface
        names = ("generate", "_get_candidate_generator", "_assisted_decoding", "_validate_generation_mode")
        before = {n: GenerationMixin.__dict__[n] for n in names}
        import fold_hf, fold_hf.modeling, fold_hf.generation, fold_hf.pairs
        fold_hf.FoldConfig, fold_hf.generate  # public names resolved
        print("untouched", all(GenerationMixin.__dict__[n] is before[n] for n in names),
              "fold" not in AttentionInterface._global_mapping)
        import sys; sys.path.insert(0, "tests")
        from tiny import tiny_target, tiny_drafter
        drafter = tiny_drafter(tiny_target())
        print("installed", GenerationMixin.__dict__["generate"].__wrapped__ is before["generate"],
              "fold" in AttentionInterface._global_mapping)
    """)
    assert "untouched True True" in out and "installed True True" in out, out


def test_target_generate_with_a_drafter_works_whatever_was_imported():
    """Hole 2: only ``fold_hf.modeling`` imported (no public name of the package touched), a drafter loaded: the
    assisted call drafts with FOLD and returns the target's greedy output."""
    out = _run_python("""
        import sys; sys.path.insert(0, "tests")
        import torch
        from fold_hf.modeling import FoldDrafter, FoldDrafterConfig
        from tiny import tiny_target, drafter_config
        target = tiny_target()
        drafter = FoldDrafter(drafter_config(target)).to(torch.float64).eval()
        ids = torch.randint(0, 11, (1, 20), generator=torch.Generator().manual_seed(0))
        ref = target.generate(ids, max_new_tokens=12, do_sample=False)
        for fast in (None, False):
            out = target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False, fold_fast=fast)
            print("equal", fast, torch.equal(out, ref), len(drafter.last_acceptance_lengths) > 0)
    """)
    assert "equal None True True" in out and "equal False True True" in out, out


def test_install_fails_loudly_when_transformers_lost_a_hook(monkeypatch):
    from transformers.generation.utils import GenerationMixin

    from fold_hf.integrations import transformers as integration

    integration.uninstall()
    try:
        monkeypatch.delattr(GenerationMixin, "_assisted_decoding")
        with pytest.raises(compat.UpstreamChanged, match="GenerationMixin has no _assisted_decoding"):
            integration.install()
        assert not integration.is_installed()
    finally:
        monkeypatch.undo()
        integration.install()
    assert integration.is_installed()


# ---------------------------------------------------------------------------------------------- no silent fallbacks
def test_a_triton_module_that_fails_to_import_is_said_once(monkeypatch):
    from fold_hf import kernels

    monkeypatch.setattr(kernels, "triton_kernels_enabled", lambda device: True)
    monkeypatch.setitem(sys.modules, "fold_hf.kernels.layer.triton", None)  # importing it raises ImportError
    monkeypatch.setattr(kernels, "_IMPORT_FAILURES", set())
    with pytest.warns(UserWarning, match=r"fold_hf.kernels.layer.triton failed to import \((ModuleNotFound|Import)Error"):
        ops = kernels.default_layer_ops("cpu")
    assert ops.backend == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels.default_layer_ops("cpu").backend == "torch"  # once


def test_the_gated_delta_kernel_import_failure_is_said(monkeypatch):
    from fold_hf import kernels
    from fold_hf.kernels import gated_delta

    monkeypatch.setattr(kernels, "triton_kernels_enabled", lambda device: True)
    monkeypatch.setitem(sys.modules, "fold_hf.kernels.gated_delta.triton", None)
    monkeypatch.setattr(kernels, "_IMPORT_FAILURES", set())
    with pytest.warns(UserWarning, match="gated_delta.triton failed to import"):
        assert gated_delta.default_gated_delta("cpu") is gated_delta.gated_delta_states_reference


def test_triton_unavailable_reason_names_the_cause(monkeypatch):
    from fold_hf.kernels import triton_unavailable_reason

    assert triton_unavailable_reason("cpu") == "tensors on cpu, not CUDA"
    monkeypatch.setenv("FOLD_HF_DISABLE_TRITON", "1")
    assert triton_unavailable_reason("cuda") == "FOLD_HF_DISABLE_TRITON=1"


def test_a_dropped_fused_drafter_step_is_said(monkeypatch):
    from tiny import tiny_target

    from fold_hf.generation.fast import session as session_module
    from fold_hf.generation.fast import settings

    monkeypatch.setattr(settings, "_WARNED", set())
    monkeypatch.setattr(session_module, "fused_drafter_unsupported", lambda drafter: "a reason the test gives")
    target = tiny_target(dtype=torch.float32)
    drafter = tiny_drafter(target)
    session = session_module.Session(target, capacity=64, tap_layer_ids=tuple(drafter.config.target_layer_ids),
                                     engine="static")
    with pytest.warns(UserWarning, match="runs its modules, not the fused kernels: a reason the test gives"):
        session.drafter_slot(drafter, request_length=32, fused=True)


def test_a_failing_private_mkl_op_is_said_once_and_f_linear_runs(monkeypatch):
    from fold_hf.kernels.gemm import cpu as cpu_gemm

    if not cpu_gemm.mkl_packed_available():
        pytest.skip("this torch build has no MKL packed ops")
    monkeypatch.setenv(cpu_gemm.BACKEND_ENV, "mkl")  # the backend whose failure the message names
    monkeypatch.setitem(cpu_gemm._state, "broken", None)
    monkeypatch.setitem(cpu_gemm._state, "warned", set())

    def broken(*args, **kwargs):
        raise RuntimeError("mkl::_mkl_reorder_linear_weight changed")

    monkeypatch.setattr(cpu_gemm, "pack", broken)
    weight = torch.nn.Parameter(torch.randn(24, 16), requires_grad=False)
    x = torch.randn(8, 16)
    with pytest.warns(UserWarning, match="MKL's private packed ops failed .*RuntimeError: mkl::_mkl_reorder"):
        out = cpu_gemm.linear(x, weight)
    torch.testing.assert_close(out, x @ weight.T)
    assert not cpu_gemm.packed_applies(x, weight)  # from then on F.linear, without a second warning


# ---------------------------------------------------------------------------------------------- hybrid rollback
QWEN35_SHAPES = {
    # hole 1 as reported: hidden 64, 4 heads / 2 KV of 16, linear key heads 2 / value heads 4, dims 16, 3 linear + 1
    "v4k2_d16": dict(hidden_size=64, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                     linear_num_key_heads=2, linear_num_value_heads=4),
    "v2k2_dk8_dv16": dict(hidden_size=32, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=16,
                          linear_num_key_heads=2, linear_num_value_heads=2),
    "v6k2_dk8_dv12": dict(hidden_size=48, head_dim=12, linear_key_head_dim=8, linear_value_head_dim=12,
                          linear_num_key_heads=2, linear_num_value_heads=6),
}
VOCAB = 32


@functools.lru_cache(maxsize=None)
def qwen35(shape: str):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3_5ForCausalLM"):
        pytest.skip("this transformers has no Qwen3.5")
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(7)
    config = Qwen3_5TextConfig(vocab_size=VOCAB, intermediate_size=96, num_hidden_layers=8, num_attention_heads=4,
                               num_key_value_heads=2, linear_conv_kernel_dim=4, max_position_embeddings=4096,
                               tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                               layer_types=["linear_attention"] * 3 + ["full_attention"]
                               + ["linear_attention"] * 3 + ["full_attention"], **QWEN35_SHAPES[shape])
    model = Qwen3_5ForCausalLM(config).float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def _prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB - 1, (1, length), generator=torch.Generator().manual_seed(seed))


def _run(path: str, target, drafter, ids, new: int) -> torch.Tensor:
    if path == "loop":
        return fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=new, return_stats=True).sequences
    if path == "assisted":
        return target.generate(ids, assistant_model=drafter, max_new_tokens=new, do_sample=False, fold_fast=False)
    return fold_hf.fast_generate(target, drafter, ids, max_new_tokens=new, engine="static", return_stats=True).sequences


@pytest.mark.parametrize("shape", sorted(QWEN35_SHAPES))
@pytest.mark.parametrize("mode", ["fold", "dflash"])
@pytest.mark.parametrize("path", ["loop", "assisted", "fast"])
def test_qwen35_every_path_equals_greedy_with_a_two_layer_drafter(shape, mode, path):
    """Hole 1: a random 2-layer z-lab drafter (every draft rejected), fp32: every path returns target greedy."""
    target = qwen35(shape)
    drafter = tiny_drafter(target, FoldConfig(mode=mode, window=16), block=4, taps=(1, 3), num_hidden_layers=2)
    ids = _prompt(30, seed=3)
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(_run(path, target, drafter, ids, 16), ref)


def _oracle(monkeypatch, drafter, ref):
    original = drafter.propose

    def propose(last, context, cache, block_start=None, count=None, pick=None):
        tokens, scores = original(last, context, cache, block_start=block_start, count=count, pick=pick)
        return torch.tensor(oracle_tokens(ref, int(block_start), tokens.shape[0])), scores

    monkeypatch.setattr(drafter, "propose", propose)


@pytest.mark.parametrize("rollback", ["transformers", "ours"])
def test_the_round_loop_rolls_back_by_the_release_mechanism_or_ours(rollback, monkeypatch):
    """Forced partial acceptances (every count 1..B) on the round loop: with transformers' own recording where this
    release has it (5.25), and with our snapshot + replay (what 5.17 runs; forced here on any release)."""
    from fold_hf.generation import loop
    from fold_hf.targets import rollback as rollback_module

    if rollback == "transformers" and not compat.native_linear_rollback():
        pytest.skip(f"transformers {compat.TRANSFORMERS_VERSION} records no recurrent states (ours runs)")
    if rollback == "ours":
        monkeypatch.setattr(loop, "native_linear_rollback", lambda: False)
        monkeypatch.setattr(rollback_module, "native_linear_rollback", lambda: False)
    used = {"snapshot": 0}
    snapshot = rollback_module.LinearStateRollback.snapshot

    def counting(self):
        used["snapshot"] += 1
        return snapshot(self)

    monkeypatch.setattr(rollback_module.LinearStateRollback, "snapshot", counting)
    target = qwen35("v4k2_d16")
    drafter = tiny_drafter(target, FoldConfig(mode="fold", window=16), block=4, taps=(1, 3), num_hidden_layers=2)
    acceptance = []
    for seed, length in enumerate((9, 40)):
        ids = _prompt(length, seed=20 + seed)
        ref = target.generate(ids, max_new_tokens=24, do_sample=False)
        _oracle(monkeypatch, drafter, ref)
        res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=24, return_stats=True)
        assert torch.equal(res.sequences, ref), (rollback, length)
        acceptance += res.acceptance_lengths
    assert set(acceptance) >= {1, 2, 3, 4}, acceptance
    assert (used["snapshot"] > 0) == (rollback == "ours"), used


def test_ci_runs_the_family_and_integration_tests_on_the_oldest_supported_release():
    listed = [line.strip() for line in (ROOT / "tests" / "oldest_transformers.txt").read_text().splitlines()
              if line.strip() and not line.lstrip().startswith("#")]
    assert all((ROOT / name).is_file() for name in listed), listed
    for family in ("targets/test_qwen35.py", "targets/test_gemma_targets.py", "modeling/test_deepspec.py",
                   "integrations/test_front_door.py", "integrations/test_upstream_compat.py",
                   "generation/test_lossless.py"):
        assert f"tests/{family}" in listed, family
    ci = (ROOT / ".ci" / "run").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    oldest = ci.split('OLDEST="', 1)[1].split('"', 1)[0]
    assert f'"transformers>={oldest.rstrip(".*")},<6"' in pyproject, (oldest, "pyproject's bounds must match CI")
    assert compat.OLDEST_SUPPORTED == compat.Version(oldest.rstrip(".*"))
