"""The engine on the Triton kernels against the engine on the torch reference ops, without a GPU: the kernels run
on CPU tensors under TRITON_INTERPRET=1 (float32), the rest of the engine as on CUDA minus graphs and pinned copies.
Chunked prefill puts decodes first in mixed steps (they take the decode kernel), single-sequence steps take the
GEMV with its fused norm and activation, and greedy sampling takes the Triton argmax; for a model with sliding and
full KV groups and for a Gated DeltaNet hybrid too. The Triton run starts with the runner's warm-up, as on CUDA.
Same tokens, logprobs close."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when ember.ops.triton's kernels are defined

from ember import LLM, SamplingParams, ops  # noqa: E402
from tests.ops.kernel_checks import TRITON_MIN_VERSION  # noqa: E402

pytest.importorskip("triton", minversion=TRITON_MIN_VERSION)
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, tests/gpu runs the compiled kernels")

PROMPT_LENS = (5, 9, 30, 3, 17, 12)


def _generate(model_dir, warm_up: bool = False, kv_cache_dtype: str = "auto", plain: bool = True,
              graph_buffers: bool = False) -> tuple[list, list]:
    """(token ids of plain greedy, which samples by argmax alone; (token ids, logprobs) of greedy with logprobs).
    warm_up: first run the runner's start-up warm-up (CUDA runs it by itself), which must leave no trace.
    plain=False: no plain run (an empty list for it). graph_buffers: every step that fits the graph runner's
    static buffers (not captured) runs through them."""
    llm = LLM(str(model_dir), dtype="float32", device="cpu", progress=False, max_num_batched_tokens=32,
              max_num_seqs=8, kv_cache_dtype=kv_cache_dtype)
    if warm_up:
        llm.engine.runner.warm_up()
    if graph_buffers:
        llm.engine.runner.graphs = llm.engine.runner.make_graph_runner(8, use_graphs=False)
    prompts = [torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in PROMPT_LENS]
    greedy = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)) if plain else []
    scored = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0))
    return ([o.outputs[0].token_ids for o in greedy],
            [(o.outputs[0].token_ids, [row[t].logprob for row, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
             for o in scored])


def assert_scored_match(scored: list, ref: list) -> None:
    """_generate's (token ids, logprobs) runs: the same tokens, logprobs within 1e-3."""
    assert [t for t, _ in scored] == [t for t, _ in ref]
    for (_, a), (_, b) in zip(scored, ref):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-3


# qwen3: q/k norm, GQA; gemma4: sliding and full KV groups with their own block tables, softcap, KV-shared layers,
# per-layer inputs (sandwich norms, the v norm and the per-layer gate through their Triton kernels; K = V layers:
# tests/ops and tests/gpu); qwen3_5: Gated DeltaNet layers (state slots) between gated full-attention layers.
# fp8: the KV pool in fp8, written and read by the kernels as by the reference (Gemma 4's variants into an fp8 pool:
# tests/ops)
@pytest.mark.parametrize("name,kv_cache_dtype", [("qwen3", "auto"), ("gemma4", "auto"), ("qwen3_5", "auto"),
                                                 ("qwen3", "fp8")])
def test_engine_on_triton_kernels_matches_reference_ops(name, kv_cache_dtype, hf_models, hybrid_models,
                                                        monkeypatch):
    from ember.ops.triton import attention as tri_attn
    from ember.ops.triton import reduce as tri_reduce

    model_dir, _ = (hf_models if name == "qwen3" else hybrid_models)(name)
    ref = _generate(model_dir, kv_cache_dtype=kv_cache_dtype)
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    monkeypatch.setattr(tri_attn, "MIXED_DECODE_MIN_SEQS", 2)  # the small batch's mixed steps split too
    monkeypatch.setattr(tri_reduce, "MIN_ROWS", 1)
    calls = {"decode_prefix": 0, "row_argmax": 0}
    split, kernel = tri_attn._decode_prefix, tri_reduce._argmax_rows_kernel

    def counted_split(meta):
        parts = split(meta)
        calls["decode_prefix"] += parts is not None
        return parts

    class CountedKernel:  # the argmax's last launch, looked up in its module at each call
        def __getitem__(self, grid):
            calls["row_argmax"] += 1
            return kernel[grid]

    monkeypatch.setattr(tri_attn, "_decode_prefix", counted_split)
    monkeypatch.setattr(tri_reduce, "_argmax_rows_kernel", CountedKernel())
    plain, scored = _generate(model_dir, warm_up=True, kv_cache_dtype=kv_cache_dtype)
    assert calls["decode_prefix"] > 0, "no mixed step put its decodes through the decode kernel"
    assert calls["row_argmax"] > 0, "plain greedy did not sample through the Triton argmax"
    assert plain == ref[0]
    assert_scored_match(scored, ref[1])


def test_in_place_residual_adds_on_triton_kernels(hf_models, monkeypatch):
    """Steps whose o and down projections add into the residual stream in place (prefill-sized steps on CUDA;
    here from 2 tokens on, so decode and mixed steps take it too) through the Triton ops, their norms reading the
    stream alone: the reference ops' tokens, logprobs close."""
    from ember.layers import decoder
    from ember.ops import triton as tri

    model_dir, _ = hf_models("qwen3")
    _, ref = _generate(model_dir, plain=False)
    monkeypatch.setattr(decoder, "ADD_IN_PLACE_MIN_ROWS", 1)
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    rows = []
    monkeypatch.setattr(ops, "linear_add", lambda x, *a: rows.append(x.shape[0]) or tri.linear_add(x, *a))
    _, scored = _generate(model_dir, plain=False)
    assert rows and min(rows) >= 2 and max(rows) > len(PROMPT_LENS)  # decode steps and prompt chunks
    assert_scored_match(scored, ref)


def test_split_k_partials_through_the_decoder_on_cpu(hf_models, monkeypatch):
    """A bf16 Llama-family decoder whose down projections come back as float32 split-K partials (forced from 2
    rows on): the next layer's add + RMSNorm and the final norm sum them. Against the same engine with the Triton
    norms and the plain projection (the interpreter rounds bf16 toward zero, so the torch reference is no fair
    baseline): the same greedy tokens and logprobs, up to a bf16 near-tie of this flat random model."""
    from ember.ops import triton as tri
    from ember.ops.triton import gemm as tri_gemm
    from tests.helpers import assert_greedy_agrees

    model_dir, _ = hf_models("qwen3")
    prompts = [torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in PROMPT_LENS]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=8)

    def run():
        llm = LLM(str(model_dir), dtype="bfloat16", device="cpu", progress=False, max_num_seqs=8)
        return [o.outputs[0] for o in llm.generate(prompts, params)]

    for name in ("add_rms_norm", "rms_norm_linear"):
        monkeypatch.setattr(ops, name, getattr(tri, name))
    ref = run()
    calls = []
    parts = tri_gemm.split_k_parts
    monkeypatch.setattr(tri_gemm, "split_k_parts", lambda *a: calls.append(a[0].shape[0]) or parts(*a))
    monkeypatch.setattr(tri_gemm, "SPLIT_K_ROWS", (2, 512))
    monkeypatch.setattr(ops, "gated_linear_parts", tri.gated_linear_parts)
    ours = run()
    assert calls and min(calls) >= 2
    for a, b in zip(ours, ref):
        assert_greedy_agrees(a, b, tol=0.1)


@pytest.mark.parametrize("name,kv_cache_dtype", [("qwen3", "auto"), ("gemma4", "auto"), ("qwen3", "fp8"),
                                                 ("qwen3_5", "auto")])
def test_mixed_step_graph_metadata_on_triton_kernels(name, kv_cache_dtype, hf_models, hybrid_models, monkeypatch):
    """Mixed steps through the graph runner's static buffers with the metadata a captured graph has: host lists
    that give only the grid's shape (t queries in every sequence slot), so the kernels see nothing but the device
    tensors: the step's sequences, the padding sequence over the rows up to t, and empty slots after it. Decode
    steps through the static buffers too; over an fp8 pool as well; Qwen3.5's Gated DeltaNet kernels read the captured
    chunk plan (spare chunks, empty slots). The reference ops' tokens and logprobs."""
    from ember.worker.cuda_graph import CudaGraphRunner

    model_dir, _ = (hf_models if name == "qwen3" else hybrid_models)(name)
    _, ref = _generate(model_dir, kv_cache_dtype=kv_cache_dtype, plain=False)
    monkeypatch.setattr(ops, "TRITON_ON_CPU", True)
    mixed_meta, steps = CudaGraphRunner._mixed_meta, []
    monkeypatch.setattr(CudaGraphRunner, "_mixed_meta",
                        lambda self, t, host=None, plan=None: steps.append(t) or mixed_meta(self, t))  # captured lists
    _, scored = _generate(model_dir, kv_cache_dtype=kv_cache_dtype, plain=False, graph_buffers=True)
    assert steps and set(steps) <= {16, 32}
    assert_scored_match(scored, ref)
