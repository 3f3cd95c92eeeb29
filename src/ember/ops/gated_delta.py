"""Reference (torch) ops of Gated DeltaNet layers (Yang et al., "Gated Delta Networks", arXiv:2412.06464), as
transformers' Qwen3.5 implements them: the chunked gated delta rule for prefill, its single-step recurrent form
for decode, and the short causal depthwise convolution with a carried state. The CPU path and the GPU oracle.

Per head, with state S [Dk, Dv], decay a_t = exp(g_t) and write strength beta_t:
    S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T,    o_t = S_t^T q_t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor,
                  conv_state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over one sequence's chunk.

    x: [L, C] this chunk's inputs; weight: [C, K]; conv_state: [C, K-1], the K-1 inputs before x, or None at the
    start of a sequence (zeros). Returns ([L, C] outputs, [C, K-1+L] the inputs window, whose K-1 columns ending
    at offset o are the state after o tokens of the chunk).
    """
    channels, width = weight.shape[0], weight.shape[1] - 1
    xt = x.t().to(weight.dtype)
    if conv_state is None:  # zero left padding inside the conv, bit for bit as transformers computes a prompt
        out = F.conv1d(xt[None], weight[:, None, :], padding=width, groups=channels)[0, :, :x.shape[0]]
        window = F.pad(xt, (width, 0))
    else:
        window = torch.cat([conv_state.to(weight.dtype), xt], dim=-1)  # [C, K-1+L]
        out = F.conv1d(window[None], weight[:, None, :], groups=channels)[0]  # [C, L]
    return F.silu(out).t().to(x.dtype), window


def causal_conv1d_step(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence. x: [B, C]; conv_state: [B, C, K-1] -> ([B, C] outputs, [B, C, K-1] new states)."""
    window = torch.cat([conv_state.to(weight.dtype), x[:, :, None].to(weight.dtype)], dim=-1)  # [B, C, K]
    out = (window * weight[None]).sum(-1)
    return F.silu(out).to(x.dtype), window[:, :, 1:]


def _prepare(q, k, v, beta, g):
    # q, k: [..., H, Dk] (already one per value head), v: [..., H, Dv]; everything in fp32 as transformers does
    q, k = l2norm(q.float()), l2norm(k.float())
    q = q * q.shape[-1] ** -0.5
    return q, k, v.float(), beta.float(), g.float()


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           state: torch.Tensor, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked (WY / UT-transform) form over one sequence, as transformers' torch_chunk_gated_delta_rule.

    q, k: [L, H, Dk]; v: [L, H, Dv]; g (log decay), beta: [L, H]; state: [H, Dk, Dv] fp32 (zeros at the start).
    Returns ([L, H, Dv] outputs in v's dtype, [H, Dk, Dv] fp32 final state).
    """
    out_dtype = v.dtype
    length = q.shape[0]
    q, k, v, beta, g = _prepare(q, k, v, beta, g)
    # [H, L, ...] and pad L to a multiple of chunk_size
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    beta, g = beta.t(), g.t()
    pad = (chunk_size - length % chunk_size) % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    num_heads, num_chunks = q.shape[0], (length + pad) // chunk_size

    def chunks(x):  # [H, L, D] -> [H, N, C, D]
        return x.reshape(num_heads, num_chunks, chunk_size, x.shape[-1])

    v_beta, k_beta = chunks(v * beta[..., None]), chunks(k * beta[..., None])
    q, k = chunks(q), chunks(k)
    g = g.reshape(num_heads, num_chunks, chunk_size).cumsum(-1)  # cumulative log decay within a chunk
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()  # [H, N, C, C]
    ut_system = (k_beta @ k.transpose(-1, -2)) * decay
    intra = (q @ k.transpose(-1, -2)) * decay
    # solve (I + strictly_lower(ut_system)) X = rhs: the UT transform condensing the chunk's delta-rule updates
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, k_beta * g.exp()[..., None], upper=False, unitriangular=True)
    q = q * g.exp()[..., None]
    k = k * (g[..., -1:] - g).exp()[..., None]
    chunk_decay = g[..., -1].exp()[..., None, None]  # [H, N, 1, 1]
    out = torch.empty_like(new_values)
    state = state.float()
    for i in range(num_chunks):
        v_new = new_values[:, i] - k_cumdecay[:, i] @ state
        out[:, i] = q[:, i] @ state + intra[:, i] @ v_new
        state = state * chunk_decay[:, i] + k[:, i].transpose(-1, -2) @ v_new
    out = out.reshape(num_heads, -1, out.shape[-1])[:, :length].transpose(0, 1)
    return out.to(out_dtype), state


def recurrent_gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                               state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence, as transformers' torch_recurrent_gated_delta_rule.

    q, k: [B, H, Dk]; v: [B, H, Dv]; g, beta: [B, H]; state: [B, H, Dk, Dv] fp32 -> ([B, H, Dv], new state).
    """
    out_dtype = v.dtype
    q, k, v, beta, g = _prepare(q, k, v, beta, g)
    state = state.float() * g.exp()[..., None, None]
    kv_mem = (state * k[..., None]).sum(-2)  # [B, H, Dv]: what the decayed state predicts for k
    delta = (v - kv_mem) * beta[..., None]
    state = state + k[..., None] * delta[..., None, :]
    out = (state * q[..., None]).sum(-2)
    return out.to(out_dtype), state


def split_heads(x: torch.Tensor, num_k_heads: int, head_k_dim: int, num_v_heads: int,
                head_v_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, conv_dim] -> q, k [N, Hv, Dk] (each key head serves Hv/Hk consecutive value heads), v [N, Hv, Dv]."""
    key_dim = num_k_heads * head_k_dim
    q, k, v = x.split([key_dim, key_dim, num_v_heads * head_v_dim], dim=-1)
    rep = num_v_heads // num_k_heads
    q = q.reshape(-1, num_k_heads, head_k_dim).repeat_interleave(rep, dim=1)
    k = k.reshape(-1, num_k_heads, head_k_dim).repeat_interleave(rep, dim=1)
    return q, k, v.reshape(-1, num_v_heads, head_v_dim)


def gated_delta_decode(mixed: torch.Tensor, conv_weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       conv_state: torch.Tensor, ssm_state: torch.Tensor, read_slots: torch.Tensor,
                       write_slots: torch.Tensor) -> torch.Tensor:
    """One decode token per sequence through a Gated DeltaNet layer's state slots: conv1d step + SiLU, q/k/v heads,
    the gated delta rule step, and the new conv window and recurrent state written into the slots in place.

    mixed: [B, conv_dim] the q/k/v projection; conv_weight: [conv_dim, K]; g (log decay, fp32), beta: [B, Hv];
    conv_state: [num_slots, conv_dim, K-1]; ssm_state: [num_slots, Hv, Dk, Dv] fp32; read_slots, write_slots: [B]
    int64 device tensors (read < 0: start from zeros). Returns the core output [B, Hv, Dv] in mixed's dtype.
    Reads all happen before writes, so a sequence may read and write the same slot.
    """
    num_v_heads, head_k_dim, head_v_dim = ssm_state.shape[1:]
    num_k_heads = (mixed.shape[1] - num_v_heads * head_v_dim) // (2 * head_k_dim)
    reads = read_slots.clamp(min=0)
    is_fresh = (read_slots < 0)[:, None, None]  # a one-token prompt starts from zeros
    conv_in = conv_state[reads].masked_fill(is_fresh, 0)
    ssm_in = ssm_state[reads].masked_fill(is_fresh[..., None], 0)
    out, conv_new = causal_conv1d_step(mixed, conv_weight, conv_in)
    q, k, v = split_heads(out, num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    core, ssm_new = recurrent_gated_delta_step(q, k, v, g, beta, ssm_in)
    conv_state.index_copy_(0, write_slots, conv_new.to(conv_state.dtype))
    ssm_state.index_copy_(0, write_slots, ssm_new.to(ssm_state.dtype))
    return core
