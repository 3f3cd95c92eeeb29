"""Arguments shared by the verbs that load a model."""
from __future__ import annotations

import argparse
import sys

from ember.config import KV_CACHE_DTYPES


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="Hugging Face model directory (default: the built-in random-weight demo model)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present)")
    p.add_argument("--max-model-len", type=int, default=None, help="context window (default: the model's)")
    p.add_argument("--kv-cache-gb", type=float, default=None, help="KV pool size (default: from free memory)")
    p.add_argument("--load-format", default="safetensors", choices=["safetensors", "dummy"],
                   help="dummy: random weights in the checkpoint's shapes, for benchmarks")
    p.add_argument("--ssm-state-dtype", default="float32",
                   help="hybrid models' recurrent state: float32 (default), bfloat16, float16 or auto (the model "
                        "dtype): half the state memory and traffic")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPES],
                   help="the KV cache's element type: auto (the model dtype) or fp8 (e4m3: half the memory per "
                        "token and half the bytes attention reads; GPUs of compute capability 8.9+ or CPU)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="shard the model over this many devices of this host (one process each)")


def resolve_model(args: argparse.Namespace) -> str:
    if args.model is not None:
        return args.model
    from ember.demo import DEMO_NOTICE, demo_model_dir
    print(DEMO_NOTICE, file=sys.stderr)
    return str(demo_model_dir())


def build_llm(args: argparse.Namespace, **kw):
    from ember.llm import LLM
    return LLM(resolve_model(args), dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
               kv_cache_gb=args.kv_cache_gb, load_format=args.load_format,
               tensor_parallel_size=args.tensor_parallel_size, ssm_state_dtype=args.ssm_state_dtype,
               kv_cache_dtype=args.kv_cache_dtype, **kw)
