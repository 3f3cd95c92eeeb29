"""Helpers several test modules share (CPU and GPU tests alike)."""
from __future__ import annotations


def count_graph_steps(graphs) -> list[int]:
    """The batch size of every step a graph runner (CudaGraphRunner) runs from now on; each step's logits must be
    the runner's shared buffer."""
    sizes: list[int] = []
    run = graphs.run

    def spy(seqs):
        sizes.append(len(seqs))
        logits = run(seqs)
        assert logits.data_ptr() == graphs.logits.data_ptr()
        return logits

    graphs.run = spy
    return sizes


def assert_greedy_agrees(ours, ref, tol: float = 0.05) -> None:
    """The same greedy tokens with logprobs within tol, up to a bf16 near-tie: where the paths first pick different
    tokens, the reference must rate both within tol (the continuations then legitimately differ)."""
    for i, (a, b) in enumerate(zip(ours.token_ids, ref.token_ids)):
        row, ref_row = ours.logprobs[i], ref.logprobs[i]
        if a != b:
            assert a in ref_row and ref_row[b].logprob - ref_row[a].logprob <= tol, f"step {i}: {a} vs {b}"
            return
        assert abs(row[a].logprob - ref_row[b].logprob) <= tol, f"step {i}"
    assert len(ours.token_ids) == len(ref.token_ids)
