"""Greedy token selection on logits rows: the Triton kernels of :mod:`fold_hf.kernels.select.triton`, their twins
and the torch path of :mod:`fold_hf.kernels.select.naive`, the dispatcher and the token choice that uses them.

The statement every implementation is checked against is a plain Python loop over a row's float64 values (the
first maximum; the first NaN when a NaN is present), and the greedy verify's: the leading proposals equal to their
row's argmax, capped by the limit, and the argmax of the row after them.

* Triton interpreter (CPU CI): ``argmax_rows_triton`` and ``greedy_verify_triton`` against the statement over odd
  shapes (V in 1, 7, 2047, 2048, 2049, 5000 and one row of 128256; 1 to 17 rows; fp32 / bf16 / fp16; chunks of
  16, 64 and 256 entries too; the second stage with its tile cut so it runs several chunk tiles), with ties across
  chunk boundaries, NaN,
  +-inf, rows of -inf, +-0 ties, strided rows; the verify with K = 0, partial and full matches, limits as ints and
  as device tensors, limits below the match; bad inputs raise. The token choice with the kernels in place of the
  torch path (``TokenChoice.verify`` / ``pick`` read the raw bf16 logits when nothing processes them, the fp32
  processed scores under a repetition penalty or an EOS mask, with the torch path's results), and the static and
  eager engines with them give HF greedy's tokens and the torch path's acceptance lengths.
* CPU: the twins against the statement (fp64 too); the dispatcher returns the torch path on the CPU and never
  imports ``select.triton`` (a subprocess, ``sys.modules``); ``$FOLD_HF_TRITON_SELECT`` is checked; the CPU token
  choice is the torch path's arithmetic exactly.
* GPU (``@pytest.mark.gpu``): the kernels at V = 128256 (bf16, fp16, fp32; 1, 11, 16 and 17 rows) against the
  statement and ``torch.argmax``; both kernels captured in a CUDA graph and replayed over new logits, proposals and
  limits; the graphs engine with the kernels (counted) gives HF greedy's tokens, and the same tokens and acceptance
  lengths as with ``$FOLD_HF_TRITON_SELECT=0``, with and without a repetition penalty.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import fold_hf
from fold_hf.generation import fast_generate
from fold_hf.generation.sampling import Sampling, TokenChoice, pick, process, seen_rows, verify_greedy
from fold_hf.kernels.select import naive as ref
from tiny import check_graph_engine_settings, greedy_reference, mode_config, pair_on_gpu
from tiny import prompt as tiny_prompt

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INF, NAN = float("inf"), float("nan")


# ---- the statement ---------------------------------------------------------------------------------------------


def first_max(values: list[float]) -> int:
    """The first NaN's index if the row holds one, else the index of its first maximum."""
    best, best_index = values[0], 0
    for i, v in enumerate(values):
        if math.isnan(v):
            return i
        if v > best:
            best, best_index = v, i
    return best_index


def statement_argmax(scores: torch.Tensor) -> list[int]:
    return [first_max(row) for row in scores.double().cpu().tolist()]


def statement_verify(posterior: list[int], proposals: list[int], limit: int) -> tuple[int, int]:
    """(n, the round's last token) from the rows' argmax (:func:`statement_argmax`)."""
    matched = 0
    while matched < len(proposals) and proposals[matched] == posterior[matched]:
        matched += 1
    n = min(matched, limit)
    return n, posterior[n]


# ---- the rows --------------------------------------------------------------------------------------------------

KINDS = 11


def _tie_pair(vocab: int, block: int, g: torch.Generator) -> list[int]:
    """Two positions: the last entry of a chunk and the first of the next when the row spans chunks."""
    boundaries = list(range(block, vocab, block))
    if boundaries:
        b = boundaries[int(torch.randint(len(boundaries), (1,), generator=g))]
        return [b - 1, b]
    if vocab == 1:
        return [0]
    return sorted(torch.randperm(vocab, generator=g)[:2].tolist())


def score_rows(rows: int, vocab: int, dtype: torch.dtype, seed: int, block: int = ref.BLOCK) -> torch.Tensor:
    """``[rows, vocab]`` in ``dtype``, cycling through the row kinds: random normal (bf16/fp16 rounding makes
    ties), few distinct values (ties everywhere), a tie of the maximum across a chunk boundary, all -inf, a NaN
    behind a +inf, NaNs in two chunks, two +infs among -infs, one finite value among -infs, all zeros with a -0.0
    before the +0.0s, the maximum at the last entry, a tie of the maximum in the first and the last chunk."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g, dtype=torch.float64)
    for r in range(rows):
        row, kind = x[r], (r + seed) % KINDS
        last = vocab - 1
        if kind == 1:
            row.copy_(torch.randint(-2, 3, (vocab,), generator=g).double())
        elif kind == 2:
            row.clamp_(max=4.0)
            row[_tie_pair(vocab, block, g)] = 6.0
        elif kind == 3:
            row.fill_(-INF)
        elif kind == 4:
            row[int(torch.randint(vocab, (1,), generator=g))] = INF
            row[last] = NAN
        elif kind == 5:
            for i in _tie_pair(vocab, block, g)[::-1]:
                row[i] = NAN
        elif kind == 6:
            row[torch.rand(vocab, generator=g) < 0.5] = -INF
            row[_tie_pair(vocab, block, g)] = INF
        elif kind == 7:
            row.fill_(-INF)
            row[int(torch.randint(vocab, (1,), generator=g))] = -3.0
        elif kind == 8:
            row.fill_(-1.0)
            row[vocab // 2 :] = 0.0
            row[vocab // 2] = -0.0
        elif kind == 9:
            row.clamp_(max=4.0)
            row[last] = 5.0
        elif kind == 10:
            row.clamp_(max=4.0)
            row[0] = row[last] = 5.0
    return x.to(dtype)


def check_argmax(fn, scores: torch.Tensor, **kw) -> None:
    got = fn(scores, **kw)
    assert got.dtype == torch.long and got.shape == (scores.shape[0],)
    assert got.cpu().tolist() == statement_argmax(scores), (tuple(scores.shape), scores.dtype, kw)


def check_verify(fn, scores: torch.Tensor, seed: int, **kw) -> None:
    """The verify at every mismatch slot j (j = K: a full match) and limits K, the match's length minus one (an int
    and a device tensor) and 0."""
    k = scores.shape[0] - 1
    posterior = statement_argmax(scores)
    g = torch.Generator().manual_seed(seed)
    vocab = scores.shape[1]
    for j in sorted({0, k, int(torch.randint(k + 1, (1,), generator=g))}):
        proposals = list(posterior[:k])
        if j < k:
            proposals[j] = (proposals[j] + 1 + int(torch.randint(max(vocab - 1, 1), (1,), generator=g))) % vocab
            if vocab == 1:
                proposals[j] = 1  # no other token: an id the row cannot have
        tokens = torch.tensor(proposals, dtype=torch.long, device=scores.device)
        for limit in {k, max(j - 1, 0), 0}:
            for as_tensor in (False, True):
                lim = torch.tensor([limit], device=scores.device) if as_tensor else limit
                n, final = fn(scores, tokens, lim, **kw)
                assert n.shape == final.shape == (1,) and n.dtype == final.dtype == torch.long
                want = statement_verify(posterior, proposals, limit)
                assert (int(n), int(final)) == want, (tuple(scores.shape), scores.dtype, j, limit, as_tensor, kw)


# ---- Triton interpreter ----------------------------------------------------------------------------------------

VOCABS = (1, 7, 2047, 2048, 2049, 5000)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_argmax_kernel_in_interpreter_matches_the_loop(interpreter, vocab, dtype, monkeypatch):
    """Also with the second stage's tile cut to 16 partials (one chunk a tile at 16+ rows): its running first
    maximum across tiles."""
    from fold_hf.kernels.select import triton as triton_select
    from fold_hf.kernels.select.triton import argmax_rows_triton

    for rows in (1, 6, 17):
        scores = score_rows(rows, vocab, dtype, seed=rows + vocab)
        check_argmax(argmax_rows_triton, scores)
        with monkeypatch.context() as patch:
            patch.setattr(triton_select, "FINISH_TILE", 16)
            check_argmax(argmax_rows_triton, scores)


def test_argmax_kernel_in_interpreter_at_llama_vocab_and_small_chunks(interpreter):
    """One row of 128256 (bf16 and fp32) and chunks of 16 / 64 entries: many chunks per row, a second stage over
    several chunk tiles (rows x chunks above its tile), ties across both kinds of boundary; strided rows."""
    from fold_hf.kernels.select.triton import argmax_rows_triton

    for kind, dtype in ((2, torch.bfloat16), (5, torch.float32)):
        check_argmax(argmax_rows_triton, score_rows(1, 128256, dtype, seed=kind))
    for block, rows in ((16, 3), (64, 17)):
        scores = score_rows(rows, 5000, torch.bfloat16, seed=rows, block=block)
        check_argmax(argmax_rows_triton, scores, block=block)
    wide = score_rows(5, 3000, torch.float16, seed=4)
    check_argmax(argmax_rows_triton, wide[:, :2100])  # rows strided by 3000
    check_argmax(argmax_rows_triton, wide.t().contiguous().t()[:, 5:])  # column-major: read through a copy


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k, vocab", [(0, 7), (0, 2049), (1, 1), (3, 2048), (5, 5000), (16, 2049)])
def test_greedy_verify_kernel_in_interpreter_matches_the_loop(interpreter, k, vocab, dtype, monkeypatch):
    """Also with the second stage's tile cut to 16 partials (several chunk tiles), and chunks of 256 entries."""
    from fold_hf.kernels.select import triton as triton_select
    from fold_hf.kernels.select.triton import greedy_verify_triton

    scores = score_rows(k + 1, vocab, dtype, seed=k * 7 + vocab)
    check_verify(greedy_verify_triton, scores, seed=k)
    monkeypatch.setattr(triton_select, "FINISH_TILE", 16)
    check_verify(greedy_verify_triton, scores, seed=k + 1)
    if 256 < vocab and k <= 5:
        check_verify(greedy_verify_triton, score_rows(k + 1, vocab, dtype, seed=k, block=256), seed=k, block=256)


def test_greedy_verify_kernel_returns_the_posterior_and_checks_inputs(interpreter):
    from fold_hf.kernels.select.triton import greedy_verify_triton

    scores = score_rows(5, 300, torch.float32, seed=3)
    proposals = torch.tensor(statement_argmax(scores)[:4])
    n, final, posterior = greedy_verify_triton(scores, proposals, torch.tensor([4]), return_posterior=True)
    assert posterior.tolist() == statement_argmax(scores) and int(n) == 4 and int(final) == posterior[4]
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        greedy_verify_triton(scores.double(), proposals, 4)
    with pytest.raises(ValueError, match=r"proposals must be \[4\]"):
        greedy_verify_triton(scores, proposals[:3], 4)
    with pytest.raises(ValueError, match="integer tokens"):
        greedy_verify_triton(scores, proposals.float(), 4)
    with pytest.raises(ValueError, match="limit"):
        greedy_verify_triton(scores, proposals, torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"\[n, V\]"):
        greedy_verify_triton(scores[0], proposals, 4)
    with pytest.raises(ValueError, match="power of two"):
        greedy_verify_triton(scores, proposals, 4, block=1000)


class Recorded:
    """The Triton selection ops standing in for the torch path on the CPU (interpreter), recording the dtype of
    every scores tensor they receive."""

    def __init__(self) -> None:
        from fold_hf.kernels import SelectOps
        from fold_hf.kernels.select.triton import argmax_rows_triton, greedy_verify_triton

        self.seen = []

        def recording(fn):
            def run(scores, *args):
                self.seen.append((fn.__name__, scores.dtype))
                return fn(scores, *args)
            return run

        self.ops = SelectOps("triton", recording(argmax_rows_triton), recording(greedy_verify_triton))

    def install(self, monkeypatch) -> None:
        import fold_hf.kernels as kernels

        monkeypatch.setattr(kernels, "greedy_select_ops", lambda device: self.ops)


def test_token_choice_takes_the_kernels_on_raw_logits_when_nothing_processes_them(interpreter, monkeypatch):
    """TokenChoice.verify and pick with the Triton ops: the raw bf16 logits when neither a penalty nor an EOS mask
    applies, the fp32 processed scores otherwise; the torch path's results either way (K = 0 to 16)."""
    vocab = 2100
    recorded = Recorded()
    for k in (0, 3, 16):
        logits = score_rows(k + 1, vocab, torch.bfloat16, seed=k)
        posterior = statement_argmax(logits)
        proposals = torch.tensor(posterior[:k], dtype=torch.long)
        if k > 1:
            proposals[k // 2] = (proposals[k // 2] + 1) % vocab
        prompt = torch.tensor([[posterior[0], 5, 7]])
        for sampling, eos, generated in ((Sampling(), [], 0), (Sampling(repetition_penalty=1.5), [], 0),
                                         (Sampling(min_new_tokens=4), [posterior[0], 11], 1)):
            def choice():
                return TokenChoice(sampling, None, vocab, "cpu", prompt, eos, k)

            limit = torch.tensor([k])
            want = choice().verify(logits, proposals, None, limit, generated)  # the torch path (CPU)
            want_pick = pick(logits, sampling)[0]
            recorded.seen.clear()
            with monkeypatch.context() as patch:
                recorded.install(patch)
                got = choice().verify(logits, proposals, None, limit, generated)
                got_pick = pick(logits, sampling)[0]
            assert [int(t) for t in got] == [int(t) for t in want], (k, sampling)
            assert torch.equal(got_pick, want_pick), (k, sampling)
            processed = sampling.penalized or sampling.min_new_tokens > 0
            verify_dtype = torch.float32 if processed else torch.bfloat16
            # pick() gets no seen / eos rows here: the raw logits whatever the settings
            assert recorded.seen == [("greedy_verify_triton", verify_dtype), ("argmax_rows_triton", torch.bfloat16)]


@pytest.mark.parametrize("engine", ["static", "eager"])
def test_engines_with_the_select_kernels_match_greedy(engine, interpreter, monkeypatch):
    """The static and eager engines (fp32 tiny pair) with the selection kernels in the interpreter: AR and the fold
    loop give HF greedy's tokens and the torch path's acceptance lengths; a repetition penalty gives the torch
    path's tokens."""
    from test_skinny_gemm import fp32_pair

    recorded = Recorded()
    kw = dict(engine=engine, max_new_tokens=8)
    with fp32_pair("llama") as (target, drafter):
        ids = tiny_prompt(7, 30)
        expected = greedy_reference(target, ids, 8)
        plain = fast_generate(target, drafter, input_ids=ids, return_stats=True, fold_config=mode_config("fold"), **kw)
        penalized = fast_generate(target, drafter, input_ids=ids, repetition_penalty=1.3, **kw)
        fold_hf.generation.release_fast_state(target)
        recorded.install(monkeypatch)
        assert torch.equal(fast_generate(target, None, input_ids=ids, **kw), expected)
        fold_hf.generation.release_fast_state(target)
        res = fast_generate(target, drafter, input_ids=ids, return_stats=True, fold_config=mode_config("fold"), **kw)
        assert torch.equal(res.sequences, expected) and res.acceptance_lengths == plain.acceptance_lengths
        fold_hf.generation.release_fast_state(target)
        assert torch.equal(fast_generate(target, drafter, input_ids=ids, repetition_penalty=1.3, **kw), penalized)
        names = {name for name, _ in recorded.seen}
        assert names == {"argmax_rows_triton", "greedy_verify_triton"}, names  # the drafter's picks and the verify


# ---- CPU -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
def test_twins_match_the_loop(dtype):
    for vocab in VOCABS:
        for rows in (1, 6, 17):
            check_argmax(ref.argmax_rows_reference, score_rows(rows, vocab, dtype, seed=rows + vocab))
    check_argmax(ref.argmax_rows_reference, score_rows(11, 128256, dtype, seed=1))
    check_argmax(ref.argmax_rows_reference, score_rows(17, 5000, dtype, seed=2, block=16), block=16)
    for k, vocab in ((0, 7), (1, 1), (3, 2048), (16, 2049)):
        check_verify(ref.greedy_verify_reference, score_rows(k + 1, vocab, dtype, seed=k), seed=k)
        check_verify(ref.greedy_verify_torch, score_rows(k + 1, vocab, dtype, seed=k), seed=k)


def test_dispatcher_takes_the_torch_path_on_cpu_without_importing_triton():
    script = (
        "import sys, torch\n"
        "import fold_hf\n"
        "from fold_hf.kernels import greedy_select_ops\n"
        "from fold_hf.generation.sampling import Sampling, TokenChoice, pick\n"
        "from fold_hf.generation import greedy_accept\n"
        # torch._dynamo imports triton by itself whenever it is installed: only the selection must add nothing
        "before = sorted(m for m in sys.modules if m.split('.')[0] == 'triton')\n"
        "ops = greedy_select_ops('cpu')\n"
        "logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))\n"
        "top = logits.argmax(-1)\n"
        "choice = TokenChoice(Sampling(), None, 50, 'cpu', torch.zeros(1, 3, dtype=torch.long), [], 3)\n"
        "n, final = choice.verify(logits, top[:3], None, 3)\n"
        "tokens = pick(logits, Sampling())[0]\n"
        "accepted, commit = greedy_accept(top[:3], logits)\n"
        "after = sorted(m for m in sys.modules if m.split('.')[0] == 'triton')\n"
        "clean = before == after and 'fold_hf.kernels.select.triton' not in sys.modules\n"
        "print(ops.backend, clean, int(n), int(final) == int(top[3]), torch.equal(tokens, top), accepted,\n"
        "      torch.equal(commit, top))\n"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["torch", "True", "3", "True", "True", "3", "True"]


def test_dispatcher_settings(monkeypatch):
    import fold_hf.kernels as kernels

    assert kernels.greedy_select_ops("cpu").backend == "torch"
    monkeypatch.setattr(kernels, "triton_kernels_enabled", lambda device: True)  # a CUDA device, stood in for
    pytest.importorskip("triton")
    monkeypatch.delenv(kernels.SELECT_ENV, raising=False)
    assert kernels.greedy_select_ops("cuda").backend == "triton"
    monkeypatch.setenv(kernels.SELECT_ENV, "0")
    assert kernels.greedy_select_ops("cuda").backend == "torch"
    monkeypatch.setenv(kernels.SELECT_ENV, "yes")
    with pytest.raises(ValueError, match=kernels.SELECT_ENV):
        kernels.greedy_select_ops("cuda")
    ops = kernels.SelectOps("triton", lambda s: "kernel", lambda s, p, limit: "kernel")
    assert ops.argmax_rows(torch.zeros(2, 3)) == "kernel"
    assert torch.equal(ops.argmax_rows(torch.zeros(2, 3, dtype=torch.float64)), torch.zeros(2, dtype=torch.long))


def test_cpu_token_choice_is_the_torch_path():
    """On the CPU TokenChoice.verify and pick compute what they computed before the kernels: process(), argmax of
    the processed scores, the eq / cumprod prefix match and the gather (penalty, EOS mask, K = 0)."""
    vocab = 40
    for k in (0, 4):
        logits = score_rows(k + 1, vocab, torch.float32, seed=k)
        logits[:, 3] = NAN if k else 0.0
        proposals = logits.argmax(-1)[:k]
        prompt = torch.tensor([[1, 2]])
        for sampling, eos in ((Sampling(), []), (Sampling(repetition_penalty=1.2), []),
                              (Sampling(min_new_tokens=3), [int(proposals[0]) if k else 0])):
            choice = TokenChoice(sampling, None, vocab, "cpu", prompt, eos, k)
            seen = seen_rows(choice.seen, proposals) if sampling.penalized else None
            scores = process(logits, sampling, seen, choice.eos_rows(0, k + 1))
            n, posterior = verify_greedy(scores, proposals, k)
            assert posterior.tolist() == scores.argmax(-1).tolist()
            got = choice.verify(logits, proposals, None, k, 0)
            assert [int(t) for t in got] == [int(n), int(posterior[n])]
            assert torch.equal(pick(logits, sampling)[0], process(logits, sampling).argmax(-1))


# ---- GPU -------------------------------------------------------------------------------------------------------

LLAMA_VOCAB = 128256


@pytest.mark.gpu(reason="the kernels compiled for a CUDA device at Llama-3.1's vocabulary")
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_match_the_loop_and_torch_on_gpu(dtype):
    from fold_hf.kernels.select.triton import argmax_rows_triton, greedy_verify_triton

    for rows in (1, 11, 16, 17):
        scores = score_rows(rows, LLAMA_VOCAB, dtype, seed=rows).cuda()
        check_argmax(argmax_rows_triton, scores)
        assert torch.equal(argmax_rows_triton(scores), scores.float().argmax(-1))
        assert torch.equal(argmax_rows_triton(scores), scores.argmax(-1))
        check_verify(greedy_verify_triton, scores, seed=rows)
        proposals = scores.float().argmax(-1)[: rows - 1]
        limit = torch.tensor([rows - 1], device="cuda")
        got = greedy_verify_triton(scores, proposals, limit)
        assert [int(t) for t in got] == [int(t) for t in ref.greedy_verify_torch(scores.float(), proposals, limit)]


@pytest.mark.gpu(reason="CUDA graphs: both kernels captured and replayed over new inputs")
def test_kernels_under_cuda_graph_replay_on_gpu():
    from fold_hf.kernels.select.triton import argmax_rows_triton, greedy_verify_triton

    k = 16
    logits = torch.zeros(k + 1, LLAMA_VOCAB, dtype=torch.bfloat16, device="cuda")
    proposals = torch.zeros(k, dtype=torch.long, device="cuda")
    limit = torch.full((1,), k, dtype=torch.long, device="cuda")

    def step():
        return argmax_rows_triton(logits[:k]), greedy_verify_triton(logits, proposals, limit)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compiles before the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        drafted, (n, final) = step()
    for trial in range(6):
        fresh = score_rows(k + 1, LLAMA_VOCAB, torch.bfloat16, seed=100 + trial)
        posterior = statement_argmax(fresh)
        tokens = list(posterior[:k])
        j = (3 * trial) % (k + 1)
        if j < k:
            tokens[j] = (tokens[j] + 1) % LLAMA_VOCAB
        cap = [k, j, max(j - 2, 0)][trial % 3]
        logits.copy_(fresh)
        proposals.copy_(torch.tensor(tokens))
        limit.fill_(cap)
        graph.replay()
        torch.cuda.synchronize()
        assert drafted.tolist() == posterior[:k] == logits[:k].argmax(-1).tolist(), trial
        assert (int(n), int(final)) == statement_verify(posterior, tokens, cap), trial


@pytest.mark.gpu(reason="CUDA graphs: the graphs engine captures the selection kernels")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_graph_engine_with_select_kernels_matches_greedy_on_gpu(arch, monkeypatch):
    check_graph_engine_settings(arch, monkeypatch, "FOLD_HF_TRITON_SELECT", ("1", "0"), [(95, 1), (96, 300)])


@pytest.mark.gpu(reason="CUDA graphs: the graphs engine captures the selection kernels")
def test_graph_engine_runs_the_select_kernels_on_gpu(monkeypatch):
    """The graphs engine calls both kernels (the drafter's greedy picks and the verify) and gives HF greedy's tokens;
    with a repetition penalty (the verify on processed scores) the torch path's tokens."""
    import fold_hf.kernels as kernels
    from fold_hf.kernels.select.triton import argmax_rows_triton, greedy_verify_triton

    calls = []

    def counting(fn):
        def run(scores, *args):
            calls.append(fn.__name__)
            return fn(scores, *args)
        return run

    kw = dict(max_new_tokens=40, engine="graphs", fold_config=mode_config("fold"))
    with pair_on_gpu("llama") as (target, drafter):
        ids = tiny_prompt(97, 200).cuda()
        expected = greedy_reference(target, ids, 40)
        monkeypatch.setenv("FOLD_HF_TRITON_SELECT", "0")
        penalized = fast_generate(target, drafter, input_ids=ids, repetition_penalty=1.3, **kw)
        fold_hf.generation.release_fast_state(target)
        monkeypatch.delenv("FOLD_HF_TRITON_SELECT")
        ops = kernels.SelectOps("triton", counting(argmax_rows_triton), counting(greedy_verify_triton))
        monkeypatch.setattr(kernels, "greedy_select_ops", lambda device: ops)
        assert torch.equal(fast_generate(target, drafter, input_ids=ids, **kw), expected)
        assert set(calls) == {"argmax_rows_triton", "greedy_verify_triton"}, calls
        fold_hf.generation.release_fast_state(target)
        assert torch.equal(fast_generate(target, drafter, input_ids=ids, repetition_penalty=1.3, **kw), penalized)
