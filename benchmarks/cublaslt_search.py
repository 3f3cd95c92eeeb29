"""Does cuBLASLt's first guess leave time on the table? For qwen3-8b's projections and LM head at decode and
prefill rows, every algorithm cuBLASLt's heuristic offers is timed (CUDA-graph replays over distinct weight copies,
>= 768 MB, so weights come from HBM) against torch's F.linear, and checked against it for correctness.

    python benchmarks/cublaslt_search.py [--rows 64,128,256,16384] [--out benchmarks/results/NAME]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from blas_backends import SHAPES, projection_cases  # noqa: E402
from gemv import graph_us  # noqa: E402
from gpu_decode import matmul_tflops  # noqa: E402

from cublaslt import CublasLt, Problem  # noqa: E402


def search(lt: CublasLt, name: str, n: int, k: int, m: int, ws: list, count: int) -> dict:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    reps = max(1, 8 // len(ws))
    ref = F.linear(x, ws[0]).float()
    torch_us = graph_us([(lambda w=w: F.linear(x, w)) for w in ws] * reps, replays=10)
    cands = lt.candidates(Problem(m, n, k, x.dtype, x.stride(0)), count)
    timed = []
    for rank, cand in enumerate(cands):
        algo = cand.algo
        err = (lt.matmul(x, ws[0], algo).float() - ref).abs().max().item()
        scale = ref.abs().max().item()
        if err > 2e-2 * scale:
            timed.append(dict(rank=rank, error=err, us=None, **lt.config(algo)))
            continue
        us = graph_us([(lambda w=w, a=algo: lt.matmul(x, w, a)) for w in ws] * reps, replays=10)
        timed.append(dict(rank=rank, us=us, error=err, waves=cand.waves_count, **lt.config(algo)))
    ok = [t for t in timed if t["us"] is not None]
    best = min(ok, key=lambda t: t["us"]) if ok else None
    row = dict(shape=name, m=m, n=n, k=k, torch_us=torch_us, candidates=len(cands),
               first_us=ok[0]["us"] if ok else None, best=best, all=timed)
    flops = 2 * m * n * k
    tqdm.write(f"{name:8s} M={m:6d}: torch {torch_us:8.1f} us ({flops / torch_us * 1e-6:4.0f} TFLOP/s)  "
               f"lt#0 {row['first_us'] or 0:8.1f}  best {best['us'] if best else 0:8.1f} "
               f"({flops / best['us'] * 1e-6 if best else 0:4.0f}) of {len(cands)} "
               f"[rank {best['rank'] if best else -1} tile {best['tile'] if best else -1} "
               f"stages {best['stages'] if best else -1} splitk {best['split_k'] if best else -1} "
               f"swz {best['swizzle'] if best else -1} cluster {best['cluster'] if best else -1}]")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="64,128,256,16384")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--count", type=int, default=64, help="candidates to ask the heuristic for")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    peak = matmul_tflops()
    lt = CublasLt()
    print(f"{torch.cuda.get_device_name()}: bf16 matmul {peak:.0f} TFLOP/s (8192^3); cuBLASLt {lt.version}")
    rows = []
    for name, n, k, m, ws in projection_cases(args.shapes, args.rows):
        rows.append(search(lt, name, n, k, m, ws, args.count))
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), peak_tflops=peak,
                                                           torch=torch.__version__, cublaslt=lt.version,
                                                           rows=rows), indent=1))


if __name__ == "__main__":
    main()
