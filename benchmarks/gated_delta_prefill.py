"""One Gated DeltaNet layer's prefill core (ops.gated_delta.gated_delta_prefill: conv, heads, the chunked delta
rule) in qwen3_5-default's shape (16 key / 32 value heads of 128, conv 4), on CUDA: the whole op with the torch or
the Triton parallel part (chunk_prepare) and conv windows, the conv (torch and Triton windows), each part alone in
torch and in Triton with each dot precision ("ieee" fp32, "tf32x3", "tf32"), and each one's error against the torch
parts in float64, and the scan's Dv slice and pipeline depth (at the default precision). Cases: one long prompt,
and many short ones (a batch's prefill step).

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
    conv_out, _ = gd.varlen_causal_conv1d(mixed, weight, conv_state, plan)
    prep_args = (conv_out, g, beta, plan, HK, DK, DV)
    scan_args = gd.chunk_prepare(*prep_args)
    # the scans' state slots (every sequence fresh, writing slot i): they write the states due here
    initial = torch.zeros(seqs, HV, DK, DV, device=dev)
    want_prep = gd.chunk_prepare(*[t.double() if torch.is_tensor(t) else t for t in prep_args])
    want_states = initial.double()
    want = gd.chunk_scan(*want_prep, want_states, plan)

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    row = dict(seqs=seqs, length=length, tokens=tokens, chunks=plan.num_chunks)
    for name, prepare, windows in (("torch", gd.chunk_prepare, gd.conv_windows),
                                   ("triton", tri.chunk_prepare, tri.conv_windows)):
        row[f"op_{name}_prepare_ms"] = cuda_ms(lambda: gd.gated_delta_prefill(
            mixed, weight, g, beta, conv_state, ssm_state, plan, HK, prepare=prepare, scan=tri.chunk_scan,
            windows=windows))
    row["conv_ms"] = cuda_ms(lambda: gd.varlen_causal_conv1d(mixed, weight, conv_state, plan))
    row["conv_triton_ms"] = cuda_ms(lambda: gd.varlen_causal_conv1d(mixed, weight, conv_state, plan,
                                                                    windows=tri.conv_windows))
    row["conv_triton_err"] = rel(gd.varlen_causal_conv1d(mixed, weight, conv_state, plan,
                                                         windows=tri.conv_windows)[0], conv_out.double())
    row["prepare_torch_ms"] = cuda_ms(lambda: gd.chunk_prepare(*prep_args))
    if plan.num_chunks <= 512:
        row["scan_torch_ms"] = cuda_ms(lambda: gd.chunk_scan(*scan_args, initial, plan), reps=2)
    default_precision = tri.PRECISION
    for precision in ("ieee", "tf32x3", "tf32"):
        tri.PRECISION = precision
        got = tri.chunk_prepare(*prep_args)
        row[f"prepare_{precision}_ms"] = cuda_ms(lambda: tri.chunk_prepare(*prep_args))
        row[f"prepare_{precision}_err"] = max(rel(a, b) for a, b in zip(got, want_prep))
        states = initial.clone()
        out = tri.chunk_scan(*scan_args, states, plan)
        row[f"scan_{precision}_ms"] = cuda_ms(lambda: tri.chunk_scan(*scan_args, initial, plan))
        row[f"scan_{precision}_err"] = rel(out, want)
        row[f"scan_{precision}_state_err"] = rel(states, want_states)
    tri.PRECISION = default_precision
    default_stages = tri.SCAN_STAGES
    for block_v in (16, 32, 64):  # the scan's Dv slice per program, and its pipeline depth over chunks
        for stages in (1, 2):
            tri.SCAN_BLOCK_V, tri.SCAN_STAGES = block_v, stages
            out = tri.chunk_scan(*scan_args, initial, plan)
            assert rel(out, want) < 1e-3, (block_v, stages)
            row[f"scan_bv{block_v}_s{stages}_ms"] = cuda_ms(lambda: tri.chunk_scan(*scan_args, initial, plan))
    tri.SCAN_BLOCK_V, tri.SCAN_STAGES = 0, default_stages
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
    cols = ["op_torch_prepare_ms", "op_triton_prepare_ms", "conv_ms", "conv_triton_ms", "prepare_torch_ms",
            "prepare_ieee_ms", "prepare_tf32_ms", "scan_torch_ms", "scan_ieee_ms", "scan_tf32x3_ms", "scan_tf32_ms",
            "prepare_ieee_err", "prepare_tf32_err", "scan_ieee_err", "scan_tf32x3_err", "scan_tf32_err"]
    cols += [f"scan_bv{bv}_s{s}_ms" for bv in (16, 32, 64) for s in (1, 2)]
    print("case " + " ".join(cols))
    for r in rows:
        print(f"{r['seqs']}x{r['length']} " + " ".join(f"{r.get(c, float('nan')):.3g}" for c in cols))
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
