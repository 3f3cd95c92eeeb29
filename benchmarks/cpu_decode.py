"""ember vs transformers `generate` decode throughput on the same CPU, in one run.

Shape: ~100M-parameter Qwen3 (hidden 768, 12 layers, 12 heads / 4 KV heads, vocab 32,000), bf16, random weights,
128-token prompts. Batch 1 (one request) and 8 (8 concurrent requests through the engine's scheduler).
Each engine runs --repeats times, alternating; the median run's tok/s is reported with the ratio ember /
transformers; --out writes a JSON with every timing.

    python benchmarks/cpu_decode.py [--output-len 128] [--out benchmarks/results/DATE-cpu_decode.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch
from tqdm import tqdm


def transformers_runner(model_dir: str, prompts: list[list[int]], output_len: int):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    ids = torch.tensor(prompts)  # equal lengths: no padding needed
    kw = dict(do_sample=False, min_new_tokens=output_len, max_new_tokens=output_len, pad_token_id=0)
    model.generate(ids[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up

    def run() -> None:
        out = model.generate(ids, **kw)
        assert out.shape[1] == ids.shape[1] + output_len

    return run


def ember_runner(model_dir: str, prompts: list[list[int]], output_len: int):
    from ember import LLM, SamplingParams

    llm = LLM(model_dir, dtype="bfloat16", device="cpu", progress=False, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    llm.generate([p[:16] for p in prompts], SamplingParams(max_tokens=4, temperature=0))  # warm-up

    def run() -> None:
        outs = llm.generate(prompts, params)
        assert all(len(o.outputs[0].token_ids) == output_len for o in outs)

    return run


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each engine, alternating; median kept")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from ember.demo import make_demo_model

    model_dir = str(make_demo_model(tempfile.mkdtemp(prefix="ember-bench-"), "qwen3-100m"))
    gen = torch.Generator().manual_seed(0)
    rows = []
    batches = [int(b) for b in args.batches.split(",")]
    with tqdm(total=2 * len(batches) * args.repeats, desc="cpu_decode") as bar:
        for b in batches:
            prompts = torch.randint(10, 32000, (b, args.prompt_len), generator=gen).tolist()
            runners = {"transformers": transformers_runner(model_dir, prompts, args.output_len),
                       "ember": ember_runner(model_dir, prompts, args.output_len)}
            times: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(args.repeats):  # alternate, so a noisy neighbour hits both alike
                for name, run in runners.items():
                    times[name].append(timed(run))
                    bar.update(1)
            # the median run of each: robust to a slow outlier on a shared machine
            hf, ours = (b * args.output_len / statistics.median(times[n]) for n in ("transformers", "ember"))
            rows.append({"batch": b, "transformers_tok_s": hf, "ember_tok_s": ours, "ratio": ours / hf,
                         "times_s": times})
    print(f"\nCPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, prompt {args.prompt_len}, output {args.output_len}")
    print(f"{'batch':>5} {'transformers tok/s':>19} {'ember tok/s':>12} {'ember/transformers':>19}")
    for r in rows:
        print(f"{r['batch']:>5} {r['transformers_tok_s']:>19.1f} {r['ember_tok_s']:>12.1f} {r['ratio']:>18.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "prompt_len": args.prompt_len, "output_len": args.output_len,
                       "torch": torch.__version__, "cores": os.cpu_count()}, f, indent=2)


if __name__ == "__main__":
    main()
