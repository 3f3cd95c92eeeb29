"""The Triton launches of the ops at real model shapes, compiled for a Hopper GPU (sm_90) on any machine: a
kernel that needs more shared memory than an SM has fails on the GPU with OutOfResources before computing
anything, which the interpreter tests (the same kernels on CPU tensors) cannot see. tests/ops/sm90_launches.py
catches the launches, compiles them with Triton's ptxas and refuses the ones that do not fit as the GPU would;
it runs in its own process because the kernels must be defined without TRITON_INTERPRET."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tests.ops.kernel_checks  # noqa: F401  (sets TRITON_INTERPRET for this process before triton is imported)

pytest.importorskip("triton")

SCRIPT = Path(__file__).with_name("sm90_launches.py")
DECODE_KERNELS = ("_conv_step_kernel", "_delta_rule_step_kernel", "_gdn_gating_kernel", "_gated_rms_norm_kernel")


def sm90_launches(**env: str) -> list[dict]:
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=environ, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]  # an OutOfResources no op handled
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def scans(records: list[dict], op: str = "qwen3_5_prefill") -> dict[tuple[str, str], list[int]]:
    """(BLOCK_V, PRECISION) -> the pipeline depths tried, in order, by the launches of one op."""
    out: dict[tuple[str, str], list[int]] = {}
    for r in records:
        if r["kernel"] == "_chunk_scan_kernel" and r["op"] == op:
            out.setdefault((r["constexprs"]["BLOCK_V"], r["constexprs"]["PRECISION"]), []).append(
                r["options"]["num_stages"])
    return out


# ~160 launches compiled cold (no Triton cache, as in CI): ~220 s on two cores, ~330 s on one
@pytest.mark.timeout(900)
def test_every_launch_fits_a_hopper_sm():
    records = sm90_launches()
    launched = [r for r in records if not r.get("rejected")]
    kernels = {(r["op"], r["kernel"]) for r in launched}
    assert {("qwen3_5_prefill", k) for k in ("_chunk_prepare_kernel", "_chunk_scan_kernel", "_conv_windows_kernel",
                                             "_window_copy_kernel", "_delta_rule_step_kernel")} <= kernels
    assert {("qwen3_5_decode_256", k) for k in DECODE_KERNELS} <= kernels
    # a float32 model: float32 activations through the same kernels (the scan may step down its pipeline)
    assert {("qwen3_5_float32", k) for k in DECODE_KERNELS + ("_chunk_prepare_kernel", "_chunk_scan_kernel")} <= kernels
    assert set(scans(launched, "qwen3_5_float32")) == {("32", "tf32x3")}
    # the scan at every Dv slice and dot precision the benchmark sweeps; the engine's (32, tf32x3) at the default
    # depth of 2, not a fallback
    assert set(scans(launched)) == {(bv, p) for bv in ("16", "32", "64") for p in ("ieee", "tf32x3", "tf32")}
    assert scans(launched)[("32", "tf32x3")] == [2]
    # every GEMV prologue (none, add + norm, norm + add; gated activations of either input layout), with PDL
    gemv = [r["constexprs"] for r in launched if r["kernel"] == "_gemv_kernel"]
    assert {(c["NORM"], c["ACT"]) for c in gemv} >= {("0", "0"), ("1", "0"), ("2", "0"), ("0", "1"), ("0", "2")}
    assert all(c["USE_PDL"] == "True" for c in gemv)
    # paged attention at head widths 128 / 256 / 512 over bf16 and float32 pools, split and unsplit decode and
    # prefill: each launched within an SM's shared memory. The tiles tuned for bf16 do not fit a float32 pool at
    # 512-wide heads (a Gemma 4 global layer asked an H100 for 292 KiB in session 24): those two step down.
    # The prefill kernel's captured variant (FLAT: one grid axis over a graphed step's query tiles) at 128.
    def attention(records):
        return {(r["kernel"], r["constexprs"]["D_PAD"], r["constexprs"]["PRECISION"], r["constexprs"].get("IS_SPLIT"),
                 r["constexprs"].get("FLAT"))
                for r in records if r["op"] == "attention" and r["kernel"] != "_decode_merge_kernel"}

    assert attention(launched) == {(k, d, p, split, flat) for d in ("128", "256", "512") for p in ("tf32", "ieee")
                                   for k, split, flat in (("_decode_kernel", "True", None),
                                                          ("_decode_kernel", "False", None),
                                                          ("_prefill_kernel", None, "False"))} | {
        ("_prefill_kernel", "128", p, None, "True") for p in ("tf32", "ieee")}
    assert attention([r for r in records if r.get("rejected")]) == {("_decode_kernel", "512", "ieee", "True", None),
                                                                    ("_prefill_kernel", "512", "ieee", None, "False")}
    # a bf16 model over an fp8 pool (fp16 dots): every launch fits as tuned
    fp8 = {(r["kernel"], r["constexprs"]["D_PAD"], r["constexprs"].get("IS_SPLIT"), bool(r.get("rejected")))
           for r in records if r["op"] == "attention_fp8" and r["kernel"] != "_decode_merge_kernel"}
    assert fp8 == {(k, d, split, False) for d in ("128", "512")
                   for k, split in (("_decode_kernel", "True"), ("_decode_kernel", "False"), ("_prefill_kernel", None))}


def test_scan_falls_back_to_a_shallower_pipeline():
    """Three stages of the scan need ~256 KiB at Dk 128 (what failed on the H100 in session 22): the op steps
    down until its launch fits instead of failing."""
    records = sm90_launches(EMBER_DELTA_SCAN_STAGES="3", SM90_PRECISIONS="tf32x3", SM90_OPS="qwen3_5_prefill")
    rejected, launched = scans([r for r in records if r.get("rejected")]), scans([r for r in records
                                                                                  if not r.get("rejected")])
    assert 3 in rejected[("32", "tf32x3")]
    assert launched[("32", "tf32x3")] == [2]
    assert set(launched) == {(bv, "tf32x3") for bv in ("16", "32", "64")}


def test_attention_steps_down_to_a_smaller_gpu():
    """On a GPU with 99 KiB of shared memory per block (sm_89, an RTX 4090) the tiles tuned for an H200's 227 do not
    all fit (bf16 prefill at 512-wide heads; float32 pools from 128-wide heads on): each launch then halves its key
    tile, drops pipeline stages and (prefill) halves its queries until it fits, instead of failing."""
    records = sm90_launches(SM_ARCH="89", SM_MAX_SHARED="101376", SM90_OPS="attention_wide")
    rejected = {(r["kernel"], r["constexprs"]["D_PAD"], r["constexprs"]["PRECISION"]) for r in records
                if r.get("rejected")}
    launched = [r for r in records if not r.get("rejected") and r["kernel"] != "_decode_merge_kernel"]
    assert rejected == {("_prefill_kernel", "512", "tf32"), ("_prefill_kernel", "256", "ieee"),
                        ("_decode_kernel", "256", "ieee")}
    refusals = [json.dumps([r["kernel"], r["constexprs"], r["options"]], sort_keys=True) for r in records
                if r.get("rejected")]
    assert len(refusals) == len(set(refusals)), "a refused tile was tried again"
    assert all(r["shared"] <= 101376 for r in launched)
    assert {(r["kernel"], r["constexprs"]["D_PAD"], r["constexprs"]["PRECISION"]) for r in launched} == \
        {(k, d, p) for k in ("_decode_kernel", "_prefill_kernel") for d, p in (("512", "tf32"), ("256", "ieee"))}

