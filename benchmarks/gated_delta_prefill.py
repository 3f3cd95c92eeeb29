"""One Gated DeltaNet layer's prefill core (ops.gated_delta.gated_delta_prefill: conv, heads, the chunked delta
rule) in qwen3_5-default's shape (16 key / 32 value heads of 128, conv 4), on CUDA: the whole op, the parallel
part before the scan, and the chunk scan with each dot precision, with the error of each against the torch scan
in float64. Cases: one long prompt, and many short ones (a batch's prefill step).

    python benchmarks/gated_delta_prefill.py [--cases 1x8192,64x128,256x128] [--out benchmarks/results/NAME]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from ember.ops import gated_delta as gd
from ember.ops.triton import gated_delta_prefill as tri

HK, HV, DK, DV, KERNEL = 16, 32, 128, 128, 4
NUM_SLOTS = 300


def cuda_ms(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def case(seqs: int, length: int) -> dict:
    dev = torch.device("cuda")
    conv_dim = 2 * HK * DK + HV * DV
    tokens = seqs * length
    mixed = torch.randn(tokens, conv_dim, device=dev, dtype=torch.bfloat16)
    weight = 0.5 * torch.randn(conv_dim, KERNEL, device=dev, dtype=torch.bfloat16)
    g = -torch.rand(tokens, HV, device=dev) * 0.5
    beta = torch.rand(tokens, HV, device=dev, dtype=torch.bfloat16)
    conv_state = torch.zeros(NUM_SLOTS, conv_dim, KERNEL - 1, device=dev, dtype=torch.bfloat16)
    ssm_state = torch.zeros(NUM_SLOTS, HV, DK, DV, device=dev)
    starts = [i * length for i in range(seqs + 1)]
    plan = gd.ChunkPlan.build(starts, [-1] * seqs, list(range(seqs)), [()] * seqs, KERNEL - 1, dev)
    # capture the scan's inputs once, through the op itself
    captured = {}

    def capture(*args):
        captured["args"] = args
        return gd.chunk_scan(*args)

    gd.gated_delta_prefill(mixed, weight, g, beta, conv_state, ssm_state, plan, HK, scan=capture)
    args = captured["args"]
    want, want_states = gd.chunk_scan(*[a.double() for a in args[:7]], plan)
    row = dict(seqs=seqs, length=length, tokens=tokens, chunks=plan.num_chunks)
    row["op_ms"] = cuda_ms(lambda: gd.gated_delta_prefill(mixed, weight, g, beta, conv_state, ssm_state, plan, HK,
                                                            scan=tri.chunk_scan))
    row["parallel_part_ms"] = cuda_ms(lambda: gd.gated_delta_prefill(
        mixed, weight, g, beta, conv_state, ssm_state, plan, HK,
        scan=lambda w, u, *rest: (torch.empty_like(u), w.new_empty(plan.num_rows, HV, DK, DV))))
    if plan.num_chunks <= 512:
        row["torch_scan_ms"] = cuda_ms(lambda: gd.chunk_scan(*args), reps=2)
    for precision in ("ieee", "tf32x3", "tf32"):
        tri.PRECISION = precision
        out, states = tri.chunk_scan(*args)
        row[f"scan_{precision}_ms"] = cuda_ms(lambda: tri.chunk_scan(*args))
        row[f"scan_{precision}_err"] = ((out.double() - want).norm() / want.norm()).item()
        row[f"scan_{precision}_state_err"] = ((states.double() - want_states).norm() / want_states.norm()).item()
    tri.PRECISION = "ieee"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="1x8192,64x128,256x128,4x2048")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for spec in tqdm(args.cases.split(","), desc="cases"):
        seqs, length = (int(x) for x in spec.split("x"))
        row = case(seqs, length)
        tqdm.write(json.dumps(row))
        rows.append(row)
    print(f"{'case':>10} {'op ms':>8} {'parallel':>9} {'scan ieee':>10} {'tf32x3':>8} {'tf32':>8} "
          f"{'err ieee':>9} {'tf32x3':>9} {'tf32':>9}")
    for r in rows:
        print(f"{r['seqs']:>4}x{r['length']:<5} {r['op_ms']:8.3f} {r['parallel_part_ms']:9.3f} "
              f"{r['scan_ieee_ms']:10.3f} {r['scan_tf32x3_ms']:8.3f} {r['scan_tf32_ms']:8.3f} "
              f"{r['scan_ieee_err']:9.1e} {r['scan_tf32x3_err']:9.1e} {r['scan_tf32_err']:9.1e}")
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
