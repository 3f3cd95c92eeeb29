"""Instructions per key tile of the paged decode kernel, compiled for a Hopper GPU (sm_90) on any machine.

A decode program at large batch is one warp that walks its sequence's keys tile by tile; a warp issues at most one
instruction per cycle, so the loop's instruction count bounds how fast a tile can go once the loads are in flight.
This compiles `_decode_kernel` as the engine launches it at qwen3-8b's heads (the JIT's specialization of 16-
divisible integers and aligned pointers included) with Triton's own ptxas, disassembles it with nvdisasm, and
counts the instructions of each loop by kind: no GPU needed, so a change to the kernel can be weighed before the
GPU is had. Every loop with 20+ instructions is listed (the unmasked full-tile loop, the masked partial tiles).

    python benchmarks/decode_sass.py [--batch 256] [--context 256] [--tile 32,1,2] [--out results/NAME.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.ops.sm90_launches: the signature helpers

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from tests.ops import sm90_launches as sm90  # noqa: E402

INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")
KEEP_SUFFIX = ("LDG", "LDS", "STS", "HMMA", "F2FP")  # kinds whose width or type matters (LDS.U8 against LDS.128)
compiled: list = []


def _compile(self, *args, grid, warmup, **kwargs):
    """JITFunction.run without a GPU: compile for sm_90 with the specialization the JIT would give the arguments."""
    compiled.append(sm90.compile_launch(self, args, kwargs, specialize=True)[0])


def loops(sass: str) -> list[dict]:
    """Each backward branch's body: its instruction count and the count by kind."""
    lines = sass.splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.match(r"^\.L_x_\d+:$", line)}
    out = []
    for end, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if not m or labels.get(m.group(1), end) >= end:
            continue
        ops = [x.group(1) for x in map(INSTRUCTION.match, lines[labels[m.group(1)]:end + 1]) if x]
        if len(ops) >= 20:
            kinds = collections.Counter(o if o.startswith(KEEP_SUFFIX) else o.split(".")[0] for o in ops)
            out.append(dict(instructions=len(ops), kinds=dict(kinds.most_common())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tile", default=None, help="BLOCK_N,num_warps,num_stages (default: decode_config's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("decode_sass.py compiles the kernel: run it without TRITON_INTERPRET=1")
    from ember.ops.triton import attention
    from ember.worker.attn_metadata import AttentionMetadata

    JITFunction.run = _compile
    attention._num_sms = lambda device: 132  # an H100/H200
    heads, kv_heads, head_dim, block = 32, 8, 128, 16  # qwen3-8b
    per_seq = -(-args.context // block)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(args.batch, dtype=torch.int64),
        query_start_loc=torch.arange(args.batch + 1, dtype=torch.int32),
        seq_lens=torch.full((args.batch,), args.context, dtype=torch.int32),
        block_tables=torch.arange(args.batch * per_seq, dtype=torch.int32).view(args.batch, per_seq),
        max_query_len=1, max_seq_len=args.context, query_start_loc_cpu=list(range(args.batch + 1)),
        seq_lens_cpu=[args.context] * args.batch)
    config = attention.decode_config(args.batch, kv_heads, torch.device("cuda"), head_dim)
    if args.tile:
        config.update(zip(("BLOCK_N", "num_warps", "num_stages"), map(int, args.tile.split(","))))
    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    rows = []
    for name, pool_dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
        pool = torch.zeros(2, args.batch * per_seq, block, kv_heads, head_dim, dtype=pool_dtype)
        q = torch.zeros(args.batch, heads, head_dim, dtype=torch.bfloat16)
        compiled.clear()
        attention._decode(q, pool, meta, torch.empty_like(q), 1.0, None, None, config=dict(config))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled[0].asm["cubin"])
            f.flush()
            sass = subprocess.run([str(bindir / "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                                  check=True).stdout
        row = dict(pool=name, config=config, triton=triton.__version__, shared=compiled[0].metadata.shared,
                   loops=loops(sass))
        rows.append(row)
        print(f"{name} pool, {config}: {row['shared']} B shared")
        for loop in row["loops"]:
            top = ", ".join(f"{k} {v}" for k, v in list(loop["kinds"].items())[:12])
            print(f"  loop of {loop['instructions']} instructions: {top}")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(batch=args.batch, context=args.context, rows=rows), indent=1))


if __name__ == "__main__":
    main()
