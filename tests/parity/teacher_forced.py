"""Teacher-forced logits of a lower-precision or GPU run against CPU float32.

The run under test generates greedily while its logits are recorded at every step (the prefill's last row, then
each decode step, graphed or eager); CPU float32 then scores the same tokens in one prefill. So every row of both
sees the same prefix, and the comparison holds over the whole run even where the two would pick different tokens
at a near-tie."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ember import LLM, SamplingParams

PROMPT_LEN = 40
NUM_STEPS = 512


@dataclass
class TeacherForced:
    rel: float  # relative error (Frobenius) of the decode run's logits
    agree: float  # share of steps whose token is float32's argmax
    rel_prefill: float  # relative error of the run's logits when it prefills the whole sequence
    worst_tie: float  # the largest float32 logit gap (over the row's std) between its argmax and a token picked instead

    def assert_bf16_tolerance(self, what: str) -> None:
        """bf16 keeps ~3 significant digits: logits within 1e-2 relative error, and a different pick only where
        float32 rates the two tokens within 5% of its logits' spread (a near-tie that bf16 rounding can flip)."""
        assert self.rel < 1e-2 and self.rel_prefill < 1e-2, f"{what}: rel. logits error {self.rel:.2e}, " \
            f"{self.rel_prefill:.2e} when prefilled"
        assert self.worst_tie < 0.05, f"{what}: picked a token {self.worst_tie:.3f} std below float32's argmax"


def _record(obj, name: str, rows: list[torch.Tensor], arg: int | None = 0):
    """Wraps obj.name to keep a float32 host copy of its argument `arg` (or its result when arg is None); returns
    the function that takes the wrapper off."""
    fn = getattr(obj, name)

    def wrapped(*args):
        out = fn(*args)
        rows.append((out if arg is None else args[arg]).float().cpu())
        return out

    setattr(obj, name, wrapped)
    return lambda: delattr(obj, name)


def prefill_logits(llm: LLM, tokens: list[int]) -> torch.Tensor:
    """[len(tokens), V] float32: the logits of every position, from one request's prefill (prompt logprobs)."""
    rows: list[torch.Tensor] = []
    restore = _record(llm.engine.runner.model, "compute_logits", rows, arg=None)
    try:
        llm.generate([tokens], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    finally:
        restore()
    return torch.cat(rows)


def greedy_logits(llm: LLM, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the [steps, V] float32 logits each was picked from."""
    rows: list[torch.Tensor] = []
    restore = _record(llm.engine.runner, "_sample", rows)
    try:
        params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True)
        tokens = llm.generate([prompt], params)[0].outputs[0].token_ids
    finally:
        restore()
    return tokens, torch.cat(rows)


def teacher_forced(llm: LLM, reference: LLM, steps: int = NUM_STEPS, prompt_len: int = PROMPT_LEN) -> TeacherForced:
    """llm (any device/dtype) against reference (CPU float32) over a seeded prompt and `steps` greedy tokens."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 500, (prompt_len,), generator=g).tolist()
    tokens, ours = greedy_logits(llm, prompt, steps)
    assert ours.shape[0] == steps and torch.isfinite(ours).all()
    ref = prefill_logits(reference, prompt + tokens)[prompt_len - 1:-1]  # rows predicting tokens

    def rel(x: torch.Tensor) -> float:
        return ((x - ref).norm() / ref.norm()).item()

    whole = prefill_logits(llm, prompt + tokens)[prompt_len - 1:-1]
    picked = torch.tensor(tokens)
    gaps = (ref.max(-1).values - ref.gather(1, picked[:, None])[:, 0]) / ref.std(-1)
    agree = (gaps == 0).float().mean().item()
    return TeacherForced(rel(ours), agree, rel(whole), gaps.max().item())
