"""The `ember` command line, run as a user runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ember import LLM, SamplingParams
from ember.demo import dummy_model_dir


def ember(*args: str, cache_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "EMBER_CACHE_DIR": str(cache_dir)}
    return subprocess.run([sys.executable, "-m", "ember.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=240)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ember-cache")


def test_generate_without_model_streams_labelled_demo_text(cache_dir):
    r = ember("generate", "--prompt", "Hello", "--max-tokens", "12", "--seed", "1", cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr
    assert "random weights" in r.stderr
    assert r.stdout.startswith("Hello") and len(r.stdout.strip()) > len("Hello")
    again = ember("generate", "--prompt", "Hello", "--max-tokens", "12", "--seed", "1", cache_dir=cache_dir)
    assert again.stdout == r.stdout  # seeded output is reproducible across processes


def test_generate_chat_greedy(cache_dir):
    r = ember("generate", "--chat", "--prompt", "hi", "--max-tokens", "8", "--temperature", "0", cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_info_reports_summary(cache_dir, demo_dir):
    r = ember("info", str(demo_dir), "--json", cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["model_type"] == "qwen3" and info["num_layers"] == 4
    assert info["kv_bytes_per_token"] == 4 * 2 * 2 * 64 * 2  # layers * (k,v) * kv_heads * head_dim * bf16


def test_info_state_dtype_halves_the_recurrent_state(cache_dir, tmp_path):
    """qwen3_5-default's shape (config only: info reads no weights): the state matrix in bf16 takes half its
    float32 bytes; the conv windows stay in the model dtype. A dtype not on the list is refused."""
    r = ember("make-demo-model", str(tmp_path / "m"), "--arch", "qwen3_5-default", cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr
    sizes = {}
    for dtype in ("float32", "bfloat16"):
        r = ember("info", str(tmp_path / "m"), "--json", "--ssm-state-dtype", dtype, cache_dir=cache_dir)
        assert r.returncode == 0, r.stderr
        sizes[dtype] = json.loads(r.stdout)["state_bytes_per_sequence"]
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    layers = cfg["layer_types"].count("linear_attention")
    matrix = layers * cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"]
    assert sizes["float32"] - sizes["bfloat16"] == matrix * 2
    bad = ember("info", str(tmp_path / "m"), "--ssm-state-dtype", "int8", cache_dir=cache_dir)
    assert bad.returncode == 2 and "ssm_state_dtype 'int8'" in bad.stderr


def test_make_demo_model_and_bad_input(cache_dir, tmp_path):
    r = ember("make-demo-model", str(tmp_path / "m"), "--arch", "llama", cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "llama"
    bad = ember("info", str(tmp_path / "missing"), cache_dir=cache_dir)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    bad = ember("generate", str(tmp_path / "m"), "--temperature", "-1", cache_dir=cache_dir)
    assert bad.returncode == 2 and "temperature" in bad.stderr


def test_dummy_model_dir_runs_on_token_ids(tmp_path):
    """What benchmarks load: a shape's config alone (random weights at load), token ids in and out."""
    d = dummy_model_dir("tiny", parent=tmp_path)
    assert (d / "config.json").exists() and not (d / "tokenizer.json").exists() and not list(d.glob("*.safetensors"))
    llm = LLM(str(d), load_format="dummy", dtype="float32", device="cpu", progress=False)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 4 and out.text == ""
    assert (dummy_model_dir("tiny", tokenizer=True, parent=tmp_path) / "tokenizer.json").exists()


def test_hybrid_demo_shapes_are_config_only(cache_dir, tmp_path):
    r = ember("make-demo-model", str(tmp_path / "g"), "--arch", "gemma4-default", cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr
    assert not list((tmp_path / "g").glob("*.safetensors"))
    info = ember("info", str(tmp_path / "g"), "--json", cache_dir=cache_dir)
    assert json.loads(info.stdout)["layer_kinds"] == {"SlidingWindow": 25, "FullAttention": 5}
    bad = ember("make-demo-model", str(tmp_path / "q"), "--arch", "qwen3_5-default", "--weights", cache_dir=cache_dir)
    assert bad.returncode == 2 and "load_format='dummy'" in bad.stderr
