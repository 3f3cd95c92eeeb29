"""Compile the Triton launches of ops at real model shapes for a Hopper GPU (sm_90) without one, and print what
each needs: run in its own process (the kernels must be defined without TRITON_INTERPRET), it calls the op
wrappers on CPU tensors, catches each kernel launch instead of running it, and compiles it with Triton's own
ptxas for the target. A launch that needs more shared memory than an SM has raises OutOfResources here as it
does on the GPU (which the interpreter tests cannot see), so the ops' own fallbacks run as they would there.

    python tests/ops/sm90_launches.py   # one JSON line per launch: op, kernel, constexprs, options, shared bytes
                                        # (and "rejected": true for those refused); SM90_OPS=a,b a subset,
                                        # SM90_JOBS=N processes (default: one per core)
"""
from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.errors import OutOfResources
from triton.runtime.jit import JITFunction

assert os.environ.get("TRITON_INTERPRET") != "1", "the kernels must be compiled, not interpreted"

from ember.ops import gated_delta as gd  # noqa: E402
from ember.ops.triton import gated_delta, gated_delta_prefill, gdn, gemm, pdl  # noqa: E402

# SM_ARCH / SM_MAX_SHARED: another GPU to compile for, e.g. 89 and 101376 (an RTX 4090's 99 KiB per block)
TARGET = GPUTarget("cuda", int(os.environ.get("SM_ARCH", "90")), 32)
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
POINTER = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32",
           torch.int64: "*i64", torch.int8: "*i8", torch.uint8: "*u8", torch.float8_e4m3fn: "*fp8e4nv"}
# Qwen3.5 (Qwen3.5-9B / qwen3_5-default): 16 key and 32 value heads of 128, conv 4, chunk 64
HK, HV, DK, DV, KERNEL, CHUNK = 16, 32, 128, 128, 4, 64

MAX_SHARED = int(os.environ.get("SM_MAX_SHARED", 232448))  # an sm_90 block may opt into 227 of its SM's 228 KiB
# the scan's dot precisions compiled: by default every one benchmarks/gated_delta_prefill.py measures
PRECISIONS = os.environ.get("SM90_PRECISIONS", "ieee,tf32x3,tf32").split(",")
launches: list[dict] = []  # compiled and within the limits
rejected: list[dict] = []  # refused as the GPU would refuse them


def compile_launch(fn: JITFunction, args: tuple, kwargs: dict, specialize: bool = False):
    """A kernel launch's arguments compiled for TARGET: (kernel, constexprs, options). specialize: with the
    divisibility by 16 the JIT gives integers and pointers (not those the kernel excludes), as on a GPU."""
    options = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
    kwargs.pop("launch_pdl", None)
    bound = inspect.signature(fn.fn).bind(*args, **kwargs)
    bound.apply_defaults()
    signature, constexprs = _signature(fn, bound.arguments)
    attrs = {}
    skip = set(fn.do_not_specialize) | set(getattr(fn, "do_not_specialize_on_alignment", ()))
    for i, param in enumerate(fn.params if specialize else ()):
        value = bound.arguments[param.name]
        if param.is_constexpr or param.name in skip or i in skip:
            continue
        if (value.data_ptr() % 16 == 0 if isinstance(value, torch.Tensor)
                else isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options)
    return kernel, constexprs, options


def _catch(self, *args, grid, warmup, **kwargs):
    """JITFunction.run on a GPU that is not there: compile for TARGET and, like the launch, raise OutOfResources
    where the kernel needs more shared memory than an SM has; record the launch instead of running it."""
    kernel, constexprs, options = compile_launch(self, args, kwargs)
    record = dict(kernel=self.__name__, constexprs={k: str(v) for k, v in constexprs.items()}, options=options,
                  shared=kernel.metadata.shared)
    if kernel.metadata.shared > MAX_SHARED:
        rejected.append(record)
        raise OutOfResources(kernel.metadata.shared, MAX_SHARED, "shared memory")
    launches.append(record)


def _signature(fn: JITFunction, arguments: dict) -> tuple[dict, dict]:
    signature, constexprs = {}, {}
    for param in fn.params:
        value = arguments[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = POINTER[value.dtype]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: no Triton type for {param.name}={value!r}")
    return signature, constexprs


def qwen3_5_prefill(seqs: int, length: int, dtype: torch.dtype = torch.bfloat16, precisions=None,
                    block_vs=(16, 32, 64)):
    """The prefill kernels at each dot precision and scan Dv slice (default: every one the benchmark sweeps), and
    the delta rule step of two one-token sequences (a mixed step's decode rows) among them."""
    tokens, conv_dim = seqs * length + 2, 2 * HK * DK + HV * DV
    x = torch.zeros(tokens, conv_dim, dtype=dtype)
    g, beta = torch.zeros(tokens, HV), torch.zeros(tokens, HV, dtype=dtype)
    plan = gd.ChunkPlan.build([i * length for i in range(seqs + 1)] + [tokens - 1, tokens], [-1] * (seqs + 2),
                              list(range(seqs + 2)), [()] * seqs + [(), ((1, seqs + 2),)], KERNEL - 1,
                              torch.device("cpu"), chunk_size=CHUNK)
    states = torch.zeros(seqs + 3, HV, DK, DV)
    gated_delta.step_rows(x, g, beta, states, plan, torch.zeros(tokens, HV, DV, dtype=dtype))
    weight = torch.zeros(conv_dim, KERNEL, dtype=dtype)
    gated_delta_prefill.conv_windows(torch.zeros(plan.buffer_len, conv_dim, dtype=dtype), weight, plan, dtype,
                                     torch.zeros(seqs + 3, conv_dim, KERNEL - 1, dtype=dtype))
    f32 = dict(dtype=torch.float32)
    w, q, k = (torch.zeros(plan.num_chunks, HV, CHUNK, DK, **f32) for _ in range(3))
    u = torch.zeros(plan.num_chunks, HV, CHUNK, DV, **f32)
    intra, decay = torch.zeros(plan.num_chunks, HV, CHUNK, CHUNK, **f32), torch.zeros(plan.num_chunks, HV, **f32)
    default = gated_delta_prefill.PRECISION
    for precision in precisions or PRECISIONS:
        gated_delta_prefill.PRECISION = precision
        gated_delta_prefill.chunk_prepare(x, g, beta, plan, HK, DK, DV)
        for block_v in block_vs:
            gated_delta_prefill.SCAN_BLOCK_V = block_v
            gated_delta_prefill.chunk_scan(w, u, q, k, intra, decay, states, plan)
    gated_delta_prefill.PRECISION, gated_delta_prefill.SCAN_BLOCK_V = default, 0


def qwen3_5_decode(seqs: int, dtype: torch.dtype = torch.bfloat16):
    conv_dim = 2 * HK * DK + HV * DV
    slots = torch.arange(seqs, dtype=torch.int32)
    gated_delta.gated_delta_decode(
        torch.zeros(seqs, conv_dim, dtype=dtype), torch.zeros(conv_dim, KERNEL, dtype=dtype),
        torch.zeros(seqs, HV), torch.zeros(seqs, HV, dtype=dtype),
        torch.zeros(seqs, conv_dim, KERNEL - 1, dtype=dtype), torch.zeros(seqs, HV, DK, DV), slots, slots)
    a = torch.zeros(seqs, HV, dtype=dtype)
    gdn.gdn_gating(a, a, torch.zeros(HV), torch.zeros(HV))
    core = torch.zeros(seqs, HV, DV, dtype=dtype)
    gdn.gated_rms_norm(core, core, torch.zeros(DV), 1e-6)


# batch-1 projections (N, K), one of each tile gemv_config picks: gemma4-default's qkv, down, per-layer input gate
# and projection; qwen3-8b's down
GEMV_SHAPES = ((4096, 2304), (2304, 9216), (256, 2304), (2304, 256), (4096, 12288))


def gemv_prologues():
    """The GEMV with each prologue at those shapes, launched with PDL as on a Hopper GPU (projections past the
    norm-fusion limit launch the norm kernel, then the plain GEMV). Its tiles live in registers (128 bytes of
    shared memory), so float32 is left out."""
    launch_args, pdl.launch_args = pdl.launch_args, lambda device: dict(USE_PDL=True, launch_pdl=True)
    for n, k in GEMV_SHAPES:
        x, w, nw = (torch.zeros(*shape, dtype=torch.bfloat16) for shape in ((1, k), (n, k), (k,)))
        gemm.linear(x, w)
        for act in ("silu", "gelu_pytorch_tanh"):
            gemm.gated_linear(torch.zeros(1, 2 * k, dtype=torch.bfloat16), w, None, act)
            gemm.act_mul_linear(x, x, w, None, act)
        gemm.rms_norm_linear(x, None, nw, 1e-6, w)
        gemm.rms_norm_linear(x, x, nw, 1e-6, w, None, 1.0)
        gemm.rms_norm_add_linear(x, x, nw, 1e-6, w, None, 0.0)
    pdl.launch_args = launch_args


def attention_launches(cases=((torch.bfloat16, (128, 256, 512)), (torch.float32, (128, 256, 512))), pool_dtype=None):
    """The paged decode kernel (split at 1 sequence with and without a sliding window, unsplit at 64 and 256) and
    the prefill kernel (eager; as a captured step too at 128), at head widths 128 / 256 / 512 (Llama family,
    Gemma 4's sliding and global layers) over bf16 and float32 pools (or pool_dtype under a model of the case's
    dtype), with the tiles decode_config and prefill_config pick on a GPU of 132 SMs."""
    from ember.ops.triton import attention
    from ember.worker.attn_metadata import AttentionMetadata

    attention._num_sms = lambda device: 132
    cuda, heads, kv_heads, block, context = torch.device("cuda"), 8, 4, 16, 100
    for dtype, widths in cases:
        for d in widths:
            for num_seqs, q_len, window in ((1, 1, None), (1, 1, 512), (64, 1, None), (256, 1, None), (2, 64, None)):
                seq_len, d_pad = context + q_len, max(16, triton.next_power_of_2(d))
                per_seq = -(-seq_len // block)
                starts = [i * q_len for i in range(num_seqs + 1)]
                meta = AttentionMetadata(
                    slot_mapping=torch.zeros(num_seqs * q_len, dtype=torch.int64),
                    query_start_loc=torch.tensor(starts, dtype=torch.int32),
                    seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32),
                    block_tables=torch.arange(num_seqs * per_seq, dtype=torch.int32).view(num_seqs, per_seq),
                    max_query_len=q_len, max_seq_len=seq_len, query_start_loc_cpu=starts,
                    seq_lens_cpu=[seq_len] * num_seqs)
                pool = torch.zeros(2, num_seqs * per_seq, block, kv_heads, d, dtype=pool_dtype or dtype)
                q = torch.zeros(num_seqs * q_len, heads, d, dtype=dtype)
                if q_len == 1:
                    cfg = attention.decode_config(num_seqs, kv_heads, cuda, d_pad, window)
                    attention._decode(q, pool, meta, torch.empty_like(q), 1.0, window, None, config=cfg)
                else:  # eager, and at 128-wide heads as a captured mixed step (one grid axis over its tiles)
                    cfg = attention.prefill_config(d_pad, q_len, cuda)
                    for captured in (False, True)[: 2 if d == 128 else 1]:
                        meta.captured = captured
                        attention._prefill(q, pool, meta, torch.empty_like(q), 1.0, window, None, config=cfg,
                                           flash=False)


# the launches' constexprs and options depend on the model's shape, not on the number of tokens or sequences;
# the costliest to compile first, so that parallel jobs finish together
OPS = {"attention": attention_launches,
       "qwen3_5_prefill": lambda: qwen3_5_prefill(4, 128),
       # what a smaller GPU refuses (SM_ARCH=89 SM_MAX_SHARED=101376: 99 KiB per block)
       "attention_wide": lambda: attention_launches(((torch.bfloat16, (512,)), (torch.float32, (256,)))),
       # a bf16 model over an fp8 pool (kv_cache_dtype fp8): its dots in fp16
       "attention_fp8": lambda: attention_launches(((torch.bfloat16, (128, 512)),), torch.float8_e4m3fn),
       # a float32 model: its dots in tf32x3, the scan's Dv slice the engine picks
       "qwen3_5_float32": lambda: (qwen3_5_prefill(2, 128, torch.float32, ("tf32x3",), (0,)),
                                   qwen3_5_decode(256, torch.float32)),
       "gemv": gemv_prologues,
       "qwen3_5_decode_256": lambda: qwen3_5_decode(256)}


def run_op(op: str) -> list[str]:
    """One op's launches as JSON lines (an OutOfResources the op does not handle raises, with its traceback)."""
    launches.clear()
    rejected.clear()
    OPS[op]()
    return [json.dumps(dict(op=op, **r)) for r in launches] + [json.dumps(dict(op=op, rejected=True, **r))
                                                                for r in rejected]


def main() -> None:
    JITFunction.run = _catch
    selected = os.environ.get("SM90_OPS", ",".join(OPS)).split(",")  # a subset of the ops, by name
    # compiling is ptxas-bound: ops in parallel processes (SM90_JOBS, default one per core), forked after the patch
    jobs = min(len(selected), int(os.environ.get("SM90_JOBS", os.cpu_count() or 1)))
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            lines = pool.map(run_op, selected, chunksize=1)
    else:
        lines = [run_op(op) for op in selected]
    for op_lines in lines:
        for line in op_lines:
            print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
