"""Paged decode attention on one GPU against the KV-bytes roofline and PyTorch SDPA over contiguous KV.

A decode step at batch B and context C must read B * C * 2 * kv_heads * head_dim * 2 bytes of KV per layer; this
times ember's Triton decode kernel (ember.ops.triton.attention) over those bytes and reports TB/s against the
measured copy bandwidth (--kv-dtype fp8: an fp8 pool, half the bytes). Each timing replays a CUDA graph of 32
launches that cycle over separate KV pools (>= 1 GB in all), like the layers of a model, so KV comes from HBM and
launch gaps are those of a captured step. Block tables are a random permutation of the pool, as after the
scheduler has interleaved many sequences' allocations.

Two memory layouts of the same pool are compared through strides: NHD ([block, slot, kv_head, dim], ember's) and
HND ([block, kv_head, slot, dim]: one head's tokens of a block contiguous). The peer is SDPA (flash backend) on
contiguous [B, H, C, D] tensors, which reads the same bytes without a block table. For NHD it also times the whole
decode attention of a layer from the qkv projection's output: the decode kernel with prepare_qkv fused in (q/k
norm, rotary, KV write; off in the engine) against prepare_qkv + paged_attention. --prefill-cases times the
prefill path on fresh prompts (SEQSxLEN; the kernel alone, and the engine's path, which sends prompts of
FLASH_PREFILL_MIN_QUERY tokens or more to SDPA) against SDPA's causal flash attention on the same padded batch (and
torch's varlen flash attention on the packed prompts where torch has it);
--mixed-cases a chunked-prefill step (DECODESxPROMPTS) whose decodes go to the decode kernel against the whole step
in the prefill kernel; --interleaved-cases the decode kernel between gate/up GEMMs in one graph, as in a step;
--overlap-cases a step's GEMMs and attention split in two half batches, one half's attention on a second stream
beside the other half's GEMMs (what two-batch overlap could save).

    python benchmarks/attention.py [--sweep] [--out benchmarks/results/NAME]
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from tqdm import tqdm

from ember.ops.triton import attention
from ember.worker.attn_metadata import AttentionMetadata
from gemv import fastest, graph_us  # benchmarks/gemv.py: this directory is on sys.path when run as a script

# q heads, kv heads, head dim; gemma4-default's sliding and global layers
HEADS = {"qwen3-8b": (32, 8, 128), "qwen3-0.6b": (16, 8, 128), "gemma4-sliding": (8, 4, 256),
         "gemma4-global": (8, 4, 512)}
BLOCK_SIZE = 16
LAUNCHES = 32


def copy_bandwidth() -> float:
    src = torch.empty(2**30, device="cuda", dtype=torch.int16)
    dst = torch.empty_like(src)
    for _ in range(100):  # ~0.5 s of copies first: the clocks leave idle
        dst.copy_(src)
    return 2 * src.numel() * 2 / graph_us([lambda: dst.copy_(src)] * 4, replays=10) * 1e6


class Case:
    """KV pools, block tables and queries for batch x context, in one layout."""

    def __init__(self, heads: tuple[int, int, int], batch: int, ctx: int, layout: str, seed: int = 0,
                 kv_dtype: torch.dtype = torch.bfloat16) -> None:
        hq, hkv, d = heads
        g = torch.Generator(device="cuda").manual_seed(seed)
        blocks_per_seq = -(-ctx // BLOCK_SIZE)
        num_blocks = batch * blocks_per_seq
        pool_bytes = 2 * num_blocks * BLOCK_SIZE * hkv * d * kv_dtype.itemsize
        self.num_pools = max(2, min(LAUNCHES, -(-2**30 // pool_bytes)))
        self.pools = []
        for _ in range(self.num_pools):
            if layout == "NHD":
                kv = torch.randn(2, num_blocks, BLOCK_SIZE, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
            else:  # HND storage, viewed as [2, block, slot, head, dim] through strides
                kv = torch.randn(2, num_blocks, hkv, BLOCK_SIZE, d, device="cuda", dtype=torch.bfloat16,
                                 generator=g).transpose(2, 3)
            self.pools.append(kv.to(kv_dtype))
        perm = torch.randperm(num_blocks, device="cuda", generator=g).to(torch.int32)
        self.block_tables = perm.view(batch, blocks_per_seq)
        self.q = torch.randn(batch, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        self.out = torch.empty_like(self.q)
        self.meta = AttentionMetadata(
            slot_mapping=torch.zeros(batch, dtype=torch.int64, device="cuda"),
            query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
            seq_lens=torch.full((batch,), ctx, dtype=torch.int32, device="cuda"),
            block_tables=self.block_tables, max_query_len=1, max_seq_len=ctx,
            query_start_loc_cpu=list(range(batch + 1)), seq_lens_cpu=[ctx] * batch)
        self.scale = d**-0.5
        self.qkv = torch.randn(batch, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16, generator=g)
        self.positions = (self.meta.seq_lens - 1).long()
        inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
        emb = torch.arange(ctx + 1, device="cuda").float()[:, None] * torch.cat([inv, inv])[None, :]
        self.qk = dict(num_heads=hq, num_kv_heads=hkv, q_norm_weight=torch.ones(d, device="cuda", dtype=torch.bfloat16),
                       k_norm_weight=torch.ones(d, device="cuda", dtype=torch.bfloat16), norm_eps=1e-6,
                       cos_sin=torch.cat([emb.cos(), emb.sin()], -1), rot_dim=d)
        self.kv_bytes = batch * ctx * 2 * hkv * d * kv_dtype.itemsize
        self.heads, self.batch, self.ctx = heads, batch, ctx

    def launch(self, pool: int, config: dict | None):
        kv = self.pools[pool % self.num_pools]
        return lambda: attention._decode(self.q, kv, self.meta, self.out, self.scale, None, None, config)

    def layer_us(self, fused: bool) -> float:
        """The layer's attention from qkv rows: one fused kernel, or prepare_qkv then paged_attention."""
        def call(pool):
            kv = self.pools[pool % self.num_pools]
            if fused:  # the fused kernel whatever qkv_attention's threshold would pick
                f = dict(self.qk, positions=self.positions)
                return lambda: attention._decode(self.qkv, kv, self.meta, torch.empty_like(self.q), self.scale, None,
                                                 None, fused=f)
            qk = self.qk
            return lambda: attention.paged_attention(
                attention.prepare_qkv(self.qkv, self.positions, kv, self.meta.slot_mapping, qk["num_heads"],
                                      qk["num_kv_heads"], qk["q_norm_weight"], qk["k_norm_weight"], 1e-6,
                                      qk["cos_sin"], qk["rot_dim"]), kv, self.meta, self.scale)

        return graph_us([call(i) for i in range(LAUNCHES)], replays=10)

    def time_us(self, config: dict | None = None) -> float:
        return graph_us([self.launch(i, config) for i in range(LAUNCHES)], replays=10)

    def reference(self, pool: int = 0) -> torch.Tensor:
        """SDPA over the sequences' KV gathered into contiguous [B, H, C, D]."""
        k, v = self.contiguous_kv(pool)
        return F.scaled_dot_product_attention(self.q[:, :, None], k, v, scale=self.scale, enable_gqa=True)[:, :, 0]

    def contiguous_kv(self, pool: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.pools[pool][:, self.block_tables.long()]  # [2, B, blocks, slot, head, dim]
        kv = kv.flatten(2, 3)[:, :, :self.ctx].transpose(2, 3)  # [2, B, head, C, dim]
        return kv[0].to(self.q.dtype).contiguous(), kv[1].to(self.q.dtype).contiguous()

    def sdpa_us(self) -> float:
        kvs = [self.contiguous_kv(i) for i in range(min(self.num_pools, 4))]
        q = self.q[:, :, None]

        def call(k, v):
            return lambda: F.scaled_dot_product_attention(q, k, v, scale=self.scale, enable_gqa=True)

        return graph_us([call(*kvs[i % len(kvs)]) for i in range(LAUNCHES)], replays=10)


def varlen_peer(k: torch.Tensor, v: torch.Tensor, qb: torch.Tensor, length: int, scale: float):
    """torch's variable-length flash attention (torch.nn.attention.varlen, torch 2.10+) over the same packed
    prompts, causal; None where torch lacks it. Without its enable_gqa (torch 2.11 has none) the kv heads are
    repeated up front, outside the timing."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    import inspect

    params = inspect.signature(varlen_attn).parameters
    seqs, hq, _, d = qb.shape
    q = qb.transpose(1, 2).reshape(seqs * length, hq, d)
    kw = dict(is_causal=True) if "is_causal" in params else dict(window_size=(-1, 0))
    if "enable_gqa" in params:
        kw["enable_gqa"] = True
    else:
        k, v = (t.repeat_interleave(hq // t.shape[1], 1) for t in (k, v))
    k, v = (t.transpose(1, 2).reshape(seqs * length, -1, d) for t in (k, v))
    cu = torch.arange(0, seqs * length + 1, length, device=q.device, dtype=torch.int32)
    return lambda: varlen_attn(q, k, v, cu, cu, length, length, scale=scale, **kw)


def prefill_case(heads: tuple[int, int, int], seqs: int, length: int, sweep: bool = False) -> dict:
    """Fresh prompts (no cached context): ember's paged prefill kernel against SDPA causal on [seqs, H, length, D]."""
    hq, hkv, d = heads
    g = torch.Generator(device="cuda").manual_seed(1)
    blocks = -(-length // BLOCK_SIZE)
    pool = torch.randn(2, seqs * blocks, BLOCK_SIZE, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    tables = torch.randperm(seqs * blocks, device="cuda", generator=g).to(torch.int32).view(seqs, blocks)
    q = torch.randn(seqs * length, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    starts = list(range(0, seqs * length + 1, length))
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(seqs * length, dtype=torch.int64, device="cuda"),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device="cuda"),
        seq_lens=torch.full((seqs,), length, dtype=torch.int32, device="cuda"), block_tables=tables,
        max_query_len=length, max_seq_len=length, query_start_loc_cpu=starts, seq_lens_cpu=[length] * seqs)
    scale = d**-0.5
    kv = pool[:, tables.long()].flatten(2, 3)[:, :, :length].transpose(2, 3)  # [2, seqs, hkv, length, d]
    k, v = kv[0].contiguous(), kv[1].contiguous()
    qb = q.view(seqs, length, hq, d).transpose(1, 2)

    def sdpa():
        return F.scaled_dot_product_attention(qb, k, v, is_causal=True, scale=scale, enable_gqa=True)

    out = attention.paged_attention(q, pool, meta, scale)
    ref = sdpa().transpose(1, 2).reshape_as(out)
    flops = 2 * seqs * length * length * hq * d  # QK^T + PV over the causal half
    us = graph_us([lambda: attention.paged_attention(q, pool, meta, scale)] * 8, replays=10)
    o = torch.empty_like(q)
    kernel_us = graph_us([lambda: attention._prefill(q, pool, meta, o, scale, None, None, flash=False)] * 8, replays=10)
    sdpa_us = graph_us([sdpa] * 8, replays=10)
    row = dict(kind="prefill", seqs=seqs, length=length, us=us, kernel_us=kernel_us, sdpa_us=sdpa_us,
               tflops=flops / us * 1e-6,
               sdpa_tflops=flops / sdpa_us * 1e-6,
               rel_err=((out.float() - ref.float()).norm() / ref.float().norm()).item())
    if (varlen := varlen_peer(k, v, qb, length, scale)) is not None:
        row["varlen_us"] = graph_us([varlen] * 8, replays=10)
    if sweep:
        def time_us(cfg: dict) -> float:
            o = torch.empty_like(q)
            t = graph_us([lambda: attention._prefill(q, pool, meta, o, scale, None, None, config=cfg, flash=False)] * 8,
                         replays=10)
            err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
            tqdm.write(f"  prefill {seqs}x{length} {cfg}: {t:8.1f} us ({flops / t * 1e-6:.0f} TFLOP/s) err {err:.1e}")
            return t

        best = fastest((us, attention.prefill_config(d, length, q.device)), PREFILL_CONFIGS, time_us)
        row.update(best_us=best[0], best=best[1])
    return row


def mixed_case(heads: tuple[int, int, int], decodes: int, prompts: int, ctx: int = 130, length: int = 128) -> dict:
    """A chunked-prefill step: `decodes` one-token sequences at context `ctx` listed first, then `prompts` fresh
    prompts of `length`. paged_attention sends the decodes to the decode kernel; the whole step in the prefill
    kernel is the alternative it replaces."""
    hq, hkv, d = heads
    g = torch.Generator(device="cuda").manual_seed(2)
    lens = [ctx] * decodes + [length] * prompts
    qlens = [1] * decodes + [length] * prompts
    blocks = [-(-n // BLOCK_SIZE) for n in lens]
    pool = torch.randn(2, sum(blocks), BLOCK_SIZE, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    perm = torch.randperm(sum(blocks), device="cuda", generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[at:at + n]
        at += n
    starts = [0]
    for n in qlens:
        starts.append(starts[-1] + n)
    q = torch.randn(starts[-1], hq, d, device="cuda", dtype=torch.bfloat16, generator=g)

    def meta():
        return AttentionMetadata(
            slot_mapping=torch.zeros(starts[-1], dtype=torch.int64, device="cuda"),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device="cuda"),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device="cuda"), block_tables=tables,
            max_query_len=max(qlens), max_seq_len=max(lens), query_start_loc_cpu=starts, seq_lens_cpu=lens)

    split, whole = meta(), meta()
    scale = d**-0.5
    out = torch.empty_like(q)
    ref = attention.paged_attention(q, pool, split, scale)
    attention._prefill(q, pool, whole, out, scale, None, None, flash=False)
    us = graph_us([lambda: attention.paged_attention(q, pool, split, scale)] * 8, replays=10)
    whole_us = graph_us([lambda: attention._prefill(q, pool, whole, out, scale, None, None, flash=False)] * 8,
                        replays=10)
    return dict(kind="mixed", decodes=decodes, prompts=prompts, us=us, prefill_kernel_only_us=whole_us,
                rel_err=((out.float() - ref.float()).norm() / ref.float().norm()).item())


def interleaved_case(heads: tuple[int, int, int], batch: int, ctx: int, layers: int = 36) -> dict:
    """The decode kernel between the GEMMs of a step, as in a real run: a graph of `layers` x (the gate/up
    projection of qwen3-8b at `batch` rows, attention over a distinct pool) against the same graph without the
    attention and the attention alone. Attention's share of the mixed graph, against its time alone, shows what
    running among compute-bound GEMMs (lower clocks under the power limit) costs it."""
    case = Case(heads, batch, ctx, "NHD")
    n_gu, k = 24576, 4096
    ws = [torch.randn(n_gu, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(8)]  # 1.6 GB: from HBM
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)

    def gemm(i):
        return lambda: F.linear(x, ws[i % len(ws)])

    alone = graph_us([case.launch(i, None) for i in range(layers)], replays=10)
    gemms = graph_us([gemm(i) for i in range(layers)], replays=10)
    both = graph_us([c for i in range(layers) for c in (gemm(i), case.launch(i, None))], replays=10) * 2
    return dict(kind="interleaved", batch=batch, ctx=ctx, attention_alone_us=alone, gemm_us=gemms,
                attention_among_gemms_us=both - gemms, kv_tb_s_alone=case.kv_bytes / alone / 1e6,
                kv_tb_s_among_gemms=case.kv_bytes / (both - gemms) / 1e6)


def overlap_case(heads: tuple[int, int, int], batch: int, ctx: int, layers: int = 36) -> dict:
    """What splitting a decode step into two half batches whose attention and GEMMs run at once could save (two-batch
    overlap, as SGLang and NanoFlow do): per layer of qwen3-8b's projections (qkv, o, gate/up, down) and decode
    attention, the step as the engine runs it (all rows through each op in turn) against the two halves in turn with
    one half's attention on a second stream beside the other half's GEMMs. Also times the halves' GEMMs and
    attention each alone, so that the sum shows what splitting costs the GEMMs before any overlap."""
    full = Case(heads, batch, ctx, "NHD")
    halves = [Case(heads, batch // 2, ctx, "NHD", seed=s) for s in (1, 2)]
    k, shapes = 4096, ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288))
    ws = [[torch.randn(n, kk, device="cuda", dtype=torch.bfloat16) * 0.02 for n, kk in shapes] for _ in range(8)]
    xs = {rows: (torch.randn(rows, k, device="cuda", dtype=torch.bfloat16),
                 torch.randn(rows, 12288, device="cuda", dtype=torch.bfloat16)) for rows in (batch, batch // 2)}
    side = torch.cuda.Stream()

    def gemms(i, rows):
        x, h = xs[rows]
        w = ws[i % len(ws)]
        return lambda: [F.linear(x, w[0]), F.linear(x, w[1]), F.linear(x, w[2]), F.linear(h, w[3])]

    def beside(attn, gemm):  # attn on the side stream, gemm on the capturing one, joined after both
        def call():
            cur = torch.cuda.current_stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                attn()
            gemm()
            cur.wait_stream(side)
        return call

    def seq(*calls):
        return lambda: [c() for c in calls]

    step = graph_us([seq(gemms(i, batch), full.launch(i, None)) for i in range(layers)], replays=10)
    half_gemms = graph_us([seq(gemms(i, batch // 2), gemms(i + 1, batch // 2)) for i in range(layers)], replays=10)
    half_attn = graph_us([seq(halves[0].launch(i, None), halves[1].launch(i, None)) for i in range(layers)],
                         replays=10)
    overlapped = graph_us([seq(beside(halves[0].launch(i, None), gemms(i, batch // 2)),
                               beside(halves[1].launch(i, None), gemms(i + 1, batch // 2))) for i in range(layers)],
                          replays=10)
    return dict(kind="overlap", batch=batch, ctx=ctx, step_us=step, half_gemms_us=half_gemms,
                half_attention_us=half_attn, overlapped_us=overlapped)


def sweep_configs(batch: int, head_dim: int = 128):
    if head_dim > 128:  # wide heads: a [BLOCK_N, D] tile per stage for keys and for values; fewer, narrower tiles
        if batch <= 16:
            for bn, w, splits in itertools.product((32, 64), (4, 8), (4, 8, 16)):
                yield dict(num_splits=splits, BLOCK_N=bn, num_warps=w, num_stages=2, HEADS_FIRST=True)
            return
        for bn, w, s, splits in itertools.product((16, 32, 64), (2, 4, 8), (2, 3), (1, 2)):
            yield dict(num_splits=splits, BLOCK_N=bn, num_warps=w, num_stages=s, HEADS_FIRST=True)
        return
    if batch <= 16:  # latency-bound: how many splits
        for bn, s, splits in itertools.product((32, 64), (2, 3), (4, 8, 16)):
            yield dict(num_splits=splits, BLOCK_N=bn, num_warps=4, num_stages=s, HEADS_FIRST=True)
        return
    if batch >= 128:  # one program per (sequence, kv head) covers the GPU; the heads of a sequence side by side
        # (the 2026-12-03 sweep's winners). Down to one warp: no cross-warp softmax reductions per key tile
        for bn, w, s in itertools.product((16, 32, 64, 128), (1, 2, 4, 8), (2, 3, 4)):
            yield dict(num_splits=1, BLOCK_N=bn, num_warps=w, num_stages=s, HEADS_FIRST=True)
        return
    for bn, w, s, splits in itertools.product((16, 32, 64, 128), (1, 2, 4, 8), (2, 3, 4), (1, 2)):
        yield dict(num_splits=splits, BLOCK_N=bn, num_warps=w, num_stages=s, HEADS_FIRST=True)


PREFILL_CONFIGS = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, PACK_GQA=pack)
                   for (bm, bn, w, st), pack in itertools.product((
                       (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 64, 4, 3),
                       (64, 64, 4, 3), (64, 128, 4, 3), (128, 32, 4, 4), (64, 32, 4, 4)), (False, True))]


def pairs(arg: str) -> list[tuple[int, int]]:
    """"AxB,CxD" -> [(A, B), (C, D)]; "" -> []."""
    return [tuple(int(x) for x in spec.split("x")) for spec in arg.split(",") if spec]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="qwen3-8b", choices=sorted(HEADS))
    ap.add_argument("--cases", default="1x2048,64x2048,256x128,256x256,256x384",
                    help="BATCHxCONTEXT, comma-separated")
    ap.add_argument("--layouts", default="NHD,HND")
    ap.add_argument("--prefill-cases", default="64x128,8x1024,1x8192", help="SEQSxLEN fresh prompts, comma-separated")
    ap.add_argument("--mixed-cases", default="64x63,192x64", help="DECODESxPROMPTS mixed steps, comma-separated")
    ap.add_argument("--interleaved-cases", default="", help="BATCHxCONTEXT decode attention between gate/up GEMMs")
    ap.add_argument("--overlap-cases", default="", help="BATCHxCONTEXT decode steps split in two half batches whose "
                    "attention runs beside the other half's GEMMs")
    ap.add_argument("--kv-dtype", default="bf16", choices=["bf16", "fp8"], help="the pool's dtype (fp8: e4m3)")
    ap.add_argument("--sweep", action="store_true", help="time a grid of launch configurations at each case")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    rows = []
    cases = pairs(args.cases)
    for (batch, ctx), layout in tqdm(list(itertools.product(cases, args.layouts.split(","))), desc="cases"):
        case = Case(HEADS[args.heads], batch, ctx, layout,
                    kv_dtype=torch.float8_e4m3fn if args.kv_dtype == "fp8" else torch.bfloat16)
        default = attention.decode_config(batch, case.heads[1], case.q.device,
                                          triton.next_power_of_2(case.heads[2]))
        attention._decode(case.q, case.pools[0], case.meta, case.out, case.scale, None, None)
        ref = case.reference()
        err = ((case.out.float() - ref.float()).norm() / ref.float().norm()).item()
        row = dict(heads=args.heads, kv_dtype=args.kv_dtype, batch=batch, ctx=ctx, layout=layout,
                   kv_mb=case.kv_bytes / 1e6, rel_err=err, default=default, us=case.time_us())
        if layout == "NHD" and case.heads[2] <= 128:  # (the fused kernel's prologue: Qwen3's q/k norm layout)
            row["sdpa_us"] = case.sdpa_us()
            row["fused_us"], row["unfused_us"] = case.layer_us(True), case.layer_us(False)
        if args.sweep:
            timed = []

            def time_us(cfg, case=case, timed=timed):
                timed.append(dict(config=cfg, us=case.time_us(cfg)))
                return timed[-1]["us"]

            best = fastest((row["us"], default), sweep_configs(batch, case.heads[2]), time_us)
            row.update(best_us=best[0], best=best[1], sweep=timed)
            for t in sorted(timed, key=lambda t: t["us"])[:6]:
                tqdm.write(f"  {t['us']:7.1f} us {t['config']}")
        rows.append(row)
        tb = case.kv_bytes / row["us"] / 1e6
        tqdm.write(f"B={batch:4d} C={ctx:5d} {layout}: {row['us']:7.1f} us  {tb:.2f} TB/s "
                   f"({100 * tb * 1e12 / bandwidth:.0f}% of copy) err {err:.1e}"
                   + (f"  sdpa {row['sdpa_us']:7.1f} us; from qkv: fused {row['fused_us']:7.1f} us, "
                      f"prepare + attention {row['unfused_us']:7.1f} us" if "sdpa_us" in row else "")
                   + (f"  best {row['best_us']:7.1f} us ({case.kv_bytes / row['best_us'] / 1e6:.2f} TB/s) {row['best']}"
                      if args.sweep else ""))
        del case
        torch.cuda.empty_cache()
    for seqs, length in pairs(args.prefill_cases):
        row = prefill_case(HEADS[args.heads], seqs, length, args.sweep)
        rows.append(row)
        tqdm.write(f"prefill {seqs}x{length}: {row['us']:8.1f} us ({row['tflops']:.0f} TFLOP/s; kernel alone "
                   f"{row['kernel_us']:.1f} us) "
                   f"err {row['rel_err']:.1e}  "
                   f"sdpa {row['sdpa_us']:8.1f} us ({row['sdpa_tflops']:.0f} TFLOP/s)"
                   + (f"  varlen {row['varlen_us']:8.1f} us" if "varlen_us" in row else ""))
    for decodes, prompts in pairs(args.mixed_cases):
        row = mixed_case(HEADS[args.heads], decodes, prompts)
        rows.append(row)
        tqdm.write(f"mixed step, {decodes} decodes + {prompts} prompts: {row['us']:8.1f} us with the decode kernel, "
                   f"{row['prefill_kernel_only_us']:8.1f} us all in the prefill kernel; err {row['rel_err']:.1e}")
    for batch, ctx in pairs(args.interleaved_cases):
        row = interleaved_case(HEADS[args.heads], batch, ctx)
        rows.append(row)
        tqdm.write(f"{batch}x{ctx} decode attention alone {row['attention_alone_us']:.1f} us "
                   f"({row['kv_tb_s_alone']:.2f} TB/s), among gate/up GEMMs {row['attention_among_gemms_us']:.1f} us "
                   f"({row['kv_tb_s_among_gemms']:.2f} TB/s); the GEMM {row['gemm_us']:.1f} us")
    for batch, ctx in pairs(args.overlap_cases):
        row = overlap_case(HEADS[args.heads], batch, ctx)
        rows.append(row)
        tqdm.write(f"{batch}x{ctx} step per layer (GEMMs + attention): {row['step_us']:.1f} us; two halves in turn: "
                   f"GEMMs {row['half_gemms_us']:.1f} + attention {row['half_attention_us']:.1f} us; "
                   f"each half's attention beside the other's GEMMs {row['overlapped_us']:.1f} us")
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), bandwidth=bandwidth,
                                                           rows=rows), indent=1))


if __name__ == "__main__":
    main()
