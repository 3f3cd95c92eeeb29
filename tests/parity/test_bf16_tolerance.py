"""The CPU bf16 path of the hybrid models within bf16 tolerance of float32, teacher-forced over 512 greedy steps
(tests/parity/teacher_forced.py): Gated DeltaNet state in float32 and in bf16, sliding windows, per-layer inputs.
The same comparison runs the CUDA path in tests/gpu/test_hybrid_gpu.py."""
from __future__ import annotations

import pytest

from ember import LLM
from tests.parity.teacher_forced import teacher_forced


@pytest.mark.parametrize("name,state_dtype", [("qwen3_5", "float32"), ("qwen3_5", "bfloat16"), ("gemma4", "float32")])
def test_cpu_bf16_within_tolerance_of_float32(name, state_dtype, bf16_models):
    model_dir, _ = bf16_models(name)
    reference = LLM(str(model_dir), dtype="float32", device="cpu", progress=False)
    llm = LLM(str(model_dir), dtype="bfloat16", device="cpu", progress=False, ssm_state_dtype=state_dtype)
    result = teacher_forced(llm, reference)
    result.assert_bf16_tolerance(f"{name} (state {state_dtype})")
    assert result.agree >= 0.95, f"{name}: argmax agreement {result.agree:.3f}"
