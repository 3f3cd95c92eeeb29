"""Bad model directories and options fail early with a message naming the problem."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ember import LLM, SamplingParams


@pytest.fixture()
def model_copy(hf_models, tmp_path):
    src, _ = hf_models("llama-gqa")
    dst = tmp_path / "m"
    shutil.copytree(src, dst)
    return dst


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(str(tmp_path / "nope"), progress=False)
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        LLM(str(tmp_path), progress=False)


def test_malformed_config(model_copy):
    (model_copy / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        LLM(str(model_copy), progress=False)


def test_missing_config_key_is_named(model_copy):
    cfg = json.loads((model_copy / "config.json").read_text())
    del cfg["hidden_size"]
    (model_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lacks the required key 'hidden_size'"):
        LLM(str(model_copy), progress=False)


def test_unknown_model_type_lists_supported(model_copy):
    cfg = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_neox"}))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt_neox'; supported: .*llama.*qwen3"):
        LLM(str(model_copy), progress=False)


def test_shape_mismatch_names_the_tensor(model_copy):
    cfg = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(ValueError, match=r"weight 'model.layers.0.mlp.\w+.weight' has shape \((128, 64|64, 128)\) but the model config expects \((96, 64|64, 96)\)"):
        LLM(str(model_copy), progress=False)


def test_missing_weights(model_copy):
    path = next(model_copy.glob("*.safetensors"))
    tensors = load_file(str(path))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match="lacks weights for: model.layers.1.self_attn.qkv_proj.weight"):
        LLM(str(model_copy), progress=False)
    for f in model_copy.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        LLM(str(model_copy), progress=False)


def test_unsupported_dtype_and_device(model_copy):
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        LLM(str(model_copy), dtype="int8", progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            LLM(str(model_copy), device="cuda", progress=False)


def test_sharded_checkpoint_loads(hf_models, tmp_path):
    _, hf = hf_models("qwen3")
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    llm = LLM(str(tmp_path), dtype="float32", progress=False)
    ids = list(range(5, 30))
    ref = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = llm.generate([ids], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert got.outputs[0].token_ids == ref[0, len(ids):].tolist()
