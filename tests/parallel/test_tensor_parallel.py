"""Tensor parallelism on CPU with gloo: TP=2 (two processes) gives the same greedy tokens as TP=1."""
from __future__ import annotations

import pytest
import torch

from ember import LLM, SamplingParams
from ember.parallel import TPGroup, kv_head_shard

GREEDY = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in (40, 17, 70)]


# qwen3: kv heads split over ranks; llama-linear-rope-bias: 1 kv head replicated, row-parallel biases;
# llama-mha-tied: tied embeddings through the vocab-parallel head
@pytest.mark.parametrize("name", ["qwen3", "llama-linear-rope-bias", "llama-mha-tied"])
def test_tp2_equals_tp1(hf_models, name):
    model_dir = str(hf_models(name)[0])
    ref = [o.outputs[0].token_ids for o in LLM(model_dir, dtype="float32", progress=False).generate(prompts(), GREEDY)]
    with LLM(model_dir, dtype="float32", progress=False, tensor_parallel_size=2) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts(), GREEDY)]
        assert llm.engine.runner.model.model.layers[0].self_attn.num_heads == 2  # each rank holds half the heads
    assert got == ref


def test_uneven_vocab_is_padded(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("llama", vocab_size=501, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    ids = [[5, 9, 300, 499, 500, 7]]
    ref = LLM(str(tmp_path), dtype="float32", progress=False).generate(ids, GREEDY)[0].outputs[0].token_ids
    with LLM(str(tmp_path), dtype="float32", progress=False, tensor_parallel_size=2) as llm:
        assert llm.generate(ids, GREEDY)[0].outputs[0].token_ids == ref


def test_shards_and_errors():
    assert TPGroup(1, 2).shard(8) == (4, 4)
    assert kv_head_shard(1, TPGroup(1, 4)) == (0, 1) and kv_head_shard(2, TPGroup(3, 4)) == (1, 1)
    with pytest.raises(ValueError, match="cannot be split evenly"):
        TPGroup(0, 3).shard(8)
    with pytest.raises(ValueError, match="tensor_parallel_size=0 must be >= 1"):
        LLM(None, tensor_parallel_size=0, progress=False)


def test_models_without_tp_support_are_refused(tmp_path):
    import json

    from ember.demo import make_demo_model

    d = make_demo_model(tmp_path / "m", "tiny")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3_5_text"}))
    with pytest.raises(ValueError, match="tensor parallelism is not supported for model_type 'qwen3_5_text'"):
        LLM(str(d), tensor_parallel_size=2, progress=False)
