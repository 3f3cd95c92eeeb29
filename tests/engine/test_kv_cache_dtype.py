"""kv_cache_dtype="fp8": the KV pool in fp8 (e4m3), attention in the model dtype. The pool holds twice the tokens of
a bf16 one in the same memory; logits stay within a few percent of float32 over 512 teacher-forced steps on the
models with real-model weight scales; a prefix hit reads the fp8 blocks a cold run wrote and gives its tokens."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ember import LLM, SamplingParams
from tests.parity.teacher_forced import teacher_forced

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def demo(demo_dir):
    return str(demo_dir)


@pytest.mark.parametrize("dtype,ratio", [("bfloat16", 2), ("float32", 4)])
def test_fp8_pool_holds_more_tokens_in_the_same_memory(demo, dtype, ratio):
    plain = LLM(demo, dtype=dtype, progress=False, kv_cache_gb=0.01)
    fp8 = LLM(demo, dtype=dtype, progress=False, kv_cache_gb=0.01, kv_cache_dtype="fp8")
    assert fp8.engine.runner.kv_caches[0].dtype == torch.float8_e4m3fn
    assert plain.engine.runner.kv_caches[0].dtype == getattr(torch, dtype)
    assert fp8.engine.runner.num_blocks == pytest.approx(ratio * plain.engine.runner.num_blocks, abs=ratio)
    # KV stored in another dtype never answers a prefix lookup of the other
    assert fp8.engine.namespace != plain.engine.namespace


@pytest.mark.parametrize("name", ["demo", "qwen3_5", "gemma4"])
def test_fp8_kv_within_a_few_percent_of_float32(name, demo, bf16_models):
    """Teacher-forced over 512 greedy steps against float32 with float32 KV. Measured (CPU, this session's code):
    relative logits error 0.19% (demo), 0.14% (qwen3_5), 1.5% (gemma4), argmax agreement 99.4-100%; bf16 weights
    and KV give 0.5-0.7%."""
    model_dir = demo if name == "demo" else str(bf16_models(name)[0])
    reference = LLM(model_dir, dtype="float32", device="cpu", progress=False)
    llm = LLM(model_dir, dtype="float32", device="cpu", progress=False, kv_cache_dtype="fp8")
    result = teacher_forced(llm, reference)
    assert result.rel < 3e-2 and result.rel_prefill < 3e-2, result
    assert result.agree >= 0.98 and result.worst_tie < 0.05, result


def test_fp8_prefix_hit_equals_cold_run(demo):
    shared = prompt(100, 1)
    a, b = shared + prompt(7, 2), shared + prompt(9, 3)
    cold = LLM(demo, dtype="bfloat16", progress=False, enable_prefix_caching=False, kv_cache_dtype="fp8")
    warm = LLM(demo, dtype="bfloat16", progress=False, kv_cache_dtype="fp8")
    warm.generate([a], GREEDY)
    hit = warm.generate([b], GREEDY)[0]
    assert hit.num_cached_tokens == 96
    assert hit.outputs[0].token_ids == cold.generate([b], GREEDY)[0].outputs[0].token_ids


def test_unknown_kv_cache_dtype_names_the_allowed_ones(demo):
    with pytest.raises(ValueError, match="kv_cache_dtype 'int3'; supported: auto, fp8, fp8_e4m3"):
        LLM(demo, progress=False, kv_cache_dtype="int3")
    bad = subprocess.run([sys.executable, "-m", "ember.cli.main", "generate", demo, "--kv-cache-dtype", "int3",
                          "--prompt", "hi"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'int3'" in bad.stderr


def test_info_reports_fp8_kv_bytes(demo):
    from ember.cli.info import model_summary

    plain, fp8 = model_summary(demo, "bfloat16"), model_summary(demo, "bfloat16", kv_cache_dtype="fp8")
    assert fp8["kv_cache_dtype"] == "float8_e4m3fn" and plain["kv_cache_dtype"] == "bfloat16"
    assert 2 * fp8["kv_bytes_per_token"] == plain["kv_bytes_per_token"]
