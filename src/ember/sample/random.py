"""Counter-based, batch-independent randomness for sampling.

Every random number is a pure function of (seed, step, token_id), so a request
draws the same tokens alone or in any batch, on CPU or CUDA, and a generation
resumed from a checkpoint holding only (seed, num_output_tokens) continues exactly.

Hash: the splitmix64 output function (Steele, Lea & Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014; finaliser constants from Stafford's
"Mix13"). Row key = mix(mix(seed) ^ mix(step + GAMMA)); the noise for token t is
mix(key + (t + 1) * GAMMA), i.e. exactly the t-th output of a splitmix64 stream
seeded with the row key, which passes BigCrush.

Sampling uses the Gumbel-max trick in exponential form: argmax_i(p_i / E_i) with
E_i ~ Exp(1) i.i.d. is an exact draw from p (the "exponential race").
"""

from __future__ import annotations

import torch

# int64 tensors wrap on overflow (two's complement) on CPU and CUDA, so multiplying by
# the unsigned constants written as signed gives the same low 64 bits as uint64 maths.
_GAMMA = 0x9E3779B97F4A7C15 - 2**64
_MIX_1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX_2 = 0x94D049BB133111EB - 2**64
_NUM_MANTISSA_BITS = 23  # (x + 0.5) * 2^-23 is exact in float32 for x < 2^23


def _shift_right_logical(x: torch.Tensor, shift: int) -> torch.Tensor:
    # torch's >> on int64 is arithmetic; mask off the copied sign bits.
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser: a bijection on 64-bit words with full avalanche."""
    z = (z ^ _shift_right_logical(z, 30)) * _MIX_1
    z = (z ^ _shift_right_logical(z, 27)) * _MIX_2
    return z ^ _shift_right_logical(z, 31)


def row_keys(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One 64-bit stream key per (seed, step). [B] int64 -> [B] int64."""
    assert seeds.dtype == torch.int64 and steps.dtype == torch.int64
    return _mix64(_mix64(seeds) ^ _mix64(steps + _GAMMA))


def token_counters(vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """The per-token stream offsets (t + 1) * GAMMA, [V] int64.

    Pass a precomputed one to `uniform_noise` under torch.compile: inductor folds
    arange * GAMMA into int32 index maths and fails on the 64-bit constant.
    """
    return torch.arange(1, vocab_size + 1, dtype=torch.int64, device=device) * _GAMMA


def uniform_noise(
    seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int, counters: torch.Tensor | None = None
) -> torch.Tensor:
    """Uniform noise in the open interval (0, 1), a pure function of (seed, step, token index).

    seeds, steps: [B] int64; counters: optional `token_counters(vocab_size)`. Returns
    [B, vocab_size] float32 with 2^23 equally likely values per element; the bits are
    identical on every device.
    """
    keys = row_keys(seeds, steps)  # [B]
    if counters is None:
        counters = token_counters(vocab_size, seeds.device)
    assert counters.shape == (vocab_size,)
    bits = _mix64(keys[:, None] + counters[None, :])  # [B, V]
    top_bits = _shift_right_logical(bits, 64 - _NUM_MANTISSA_BITS)  # [0, 2^23)
    return (top_bits.to(torch.float32) + 0.5) * (2.0**-_NUM_MANTISSA_BITS)


def exponential_noise(
    seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int, counters: torch.Tensor | None = None
) -> torch.Tensor:
    """Exp(1) noise, -log(u). [B] int64 x2 -> [B, vocab_size] float32 in (0, ~16.6]."""
    return uniform_noise(seeds, steps, vocab_size, counters).log_().neg_()


def sample_from_probs(
    probs: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, counters: torch.Tensor | None = None
) -> torch.Tensor:
    """One exact draw per row from `probs` [B, V] via the exponential race. Returns [B] int64."""
    noise = exponential_noise(seeds, steps, probs.shape[-1], counters)  # [B, V]
    return (probs / noise).argmax(dim=-1)
