"""Greedy sampling's row argmax over the vocabulary on one GPU: ember's two-kernel Triton argmax
(ember.ops.triton.reduce) against torch.argmax, at decode batch sizes over bf16 logits of the qwen3 vocabulary.
Each timing replays a CUDA graph of 16 launches over separate logits tensors, so they come from HBM. The engine
uses the kernels from reduce.MIN_ROWS rows on.

    python benchmarks/argmax.py [--vocab 151936] [--out benchmarks/results/NAME]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from gemv import graph_us  # benchmarks/gemv.py: this directory is on sys.path when run as a script
from ember.ops.triton import reduce
from ember.ops.triton.reduce import row_argmax

COPIES = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    reduce.MIN_ROWS = 1  # time the kernels at every batch size, also where the engine keeps torch.argmax
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        logits = [torch.randn(batch, args.vocab, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        assert all(torch.equal(row_argmax(x), x.argmax(dim=-1)) for x in logits)
        ours = graph_us([lambda x=x: row_argmax(x) for x in logits], replays=10)
        ref = graph_us([lambda x=x: x.argmax(dim=-1) for x in logits], replays=10)
        gbps = batch * args.vocab * 2 / ours / 1e3
        rows.append(dict(batch=batch, vocab=args.vocab, ours_us=ours, torch_us=ref))
        print(f"batch {batch:4d}: ember {ours:6.1f} us ({gbps:.0f} GB/s), torch.argmax {ref:6.1f} us")
        del logits
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
