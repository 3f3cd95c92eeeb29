"""Host phases before the first kernel of a 256 x 128-token generate on the GPU host (qwen3-0.6b shape, dummy)."""
import json, statistics, sys, tempfile, time
from pathlib import Path
import torch
from ember import LLM, SamplingParams
from ember.demo import make_demo_model

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3-0.6b"
d = make_demo_model(tempfile.mkdtemp(), shape, with_weights=False)
(Path(d) / "tokenizer.json").unlink(missing_ok=True)
llm = LLM(str(d), load_format="dummy", dtype="bfloat16", max_model_len=1024, max_num_seqs=256,
          enable_prefix_caching=False, progress=False)
eng, runner = llm.engine, llm.engine.runner
marks = {}
def wrap(obj, name, key):
    orig = getattr(obj, name)
    def f(*a, **k):
        marks.setdefault(key, time.perf_counter())
        r = orig(*a, **k)
        marks.setdefault(key + "_end", time.perf_counter())
        return r
    setattr(obj, name, f)
wrap(eng.scheduler, "schedule", "schedule")
wrap(runner, "_prepare", "prepare")
wrap(runner, "launch", "launch")
orig_fwd = runner.model.forward
def fwd(*a, **k):
    marks.setdefault("forward", time.perf_counter())
    return orig_fwd(*a, **k)
runner.model.forward = fwd
vocab = runner.vocab_size
g = torch.Generator().manual_seed(0)
p = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
llm.generate(torch.randint(10, vocab - 10, (8, 64), generator=g).tolist(), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
rows = []
for r in range(6):
    prompts = torch.randint(10, vocab - 10, (256, 128), generator=g).tolist()
    torch.cuda.synchronize(); marks.clear()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter(); ev0.record()
    orig_embed = runner.model.model.embed_tokens.forward
    def emb(*a, **k):
        ev1.record(); return orig_embed(*a, **k)
    runner.model.model.embed_tokens.forward = emb
    llm.generate(prompts, p)
    runner.model.model.embed_tokens.forward = orig_embed
    torch.cuda.synchronize()
    ms = lambda k: round((marks[k] - t0) * 1e3, 2)
    rows.append(dict(run=r, intake=ms("schedule"), schedule_end=ms("schedule_end"), prepare=ms("prepare"), prepare_end=ms("prepare_end"),
                     forward=ms("forward"), first_kernel_event=round(ev0.elapsed_time(ev1), 2)))
    print(json.dumps(rows[-1]), flush=True)
