"""The reference RMSNorm rounds as each family's transformers module does (bf16, bit for bit): weight_offset None
for Llama/Qwen, 1.0 for Qwen3.5's (scale - 1) weights, 0.0 for Gemma 4. The wrong mode misses about a quarter of the
values, so the check tells them apart."""
from __future__ import annotations

import pytest
import torch

from ember.ops import norm

transformers = pytest.importorskip("transformers")

from transformers.models.gemma4.modeling_gemma4 import Gemma4RMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm  # noqa: E402

FAMILIES = [(LlamaRMSNorm, None), (Qwen3_5RMSNorm, 1.0), (Gemma4RMSNorm, 0.0)]


@pytest.mark.parametrize("cls,offset", FAMILIES, ids=["llama", "qwen3_5", "gemma4"])
def test_rms_norm_rounds_as_transformers_in_bf16(cls, offset):
    g = torch.Generator().manual_seed(0)
    n = 1000
    x = (3 * torch.randn(64, n, generator=g)).bfloat16()
    module = cls(n, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(0.5 * torch.randn(n, generator=g) + (0.0 if offset == 1.0 else 1.0))
    module = module.bfloat16()
    ref = module(x)
    assert torch.equal(norm.rms_norm(x, module.weight, 1e-6, offset), ref)
    for other in {None, 1.0, 0.0} - {offset}:  # another family's rounding does not pass for this one
        assert not torch.equal(norm.rms_norm(x, module.weight, 1e-6, other), ref)
    # the fused forms round the same way
    r = torch.randn(64, n, generator=g).bfloat16()
    out, h = norm.add_rms_norm(x, r, module.weight, 1e-6, offset)
    assert torch.equal(h, x + r) and torch.equal(out, module(x + r))
