import pytest
import torch

from ember.sample.random import exponential_noise, sample_from_probs, token_counters, uniform_noise

PROBS = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02, 0.0])
NUM_DRAWS = 20_000


def _repeat(value: int, n: int) -> torch.Tensor:
    return torch.full((n,), value, dtype=torch.int64)


_MASK = 2**64 - 1
_GAMMA = 0x9E3779B97F4A7C15


def _mix64_reference(z: int) -> int:
    z &= _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _uniform_reference(seed: int, step: int, token: int) -> float:
    """The spec, in unsigned python ints: splitmix64 stream keyed by (seed, step)."""
    key = _mix64_reference(_mix64_reference(seed) ^ _mix64_reference(step + _GAMMA))
    bits = _mix64_reference(key + (token + 1) * _GAMMA)
    return ((bits >> 41) + 0.5) * 2.0**-23


def test_noise_matches_unsigned_reference() -> None:
    seeds = [0, 42, -7, 2**63 - 1, -(2**63)]
    steps = [0, 5, 2**40, 1, 2**62]
    noise = uniform_noise(torch.tensor(seeds), torch.tensor(steps), 70)
    expected = [[_uniform_reference(s, t, v) for v in range(70)] for s, t in zip(seeds, steps)]
    assert noise.tolist() == expected
    counters = token_counters(70, "cpu")
    assert torch.equal(uniform_noise(torch.tensor(seeds), torch.tensor(steps), 70, counters), noise)


def test_noise_pinned_values() -> None:
    # Checkpoints store only (seed, step): changing the hash silently changes resumed output.
    noise = uniform_noise(torch.tensor([0, 42, -7]), torch.tensor([0, 5, 2**40]), 4)
    expected = [
        [0.33805245, 0.26913029, 0.27156657, 0.48016959],
        [0.70113558, 0.20649630, 0.46530384, 0.22771031],
        [0.56885320, 0.98866099, 0.23113233, 0.22634512],
    ]
    torch.testing.assert_close(noise, torch.tensor(expected), rtol=0, atol=1e-7)


def test_noise_is_in_open_unit_interval_and_uniform(assert_distribution) -> None:
    noise = uniform_noise(torch.arange(200), torch.arange(200) * 3, 1000)  # [200, 1000]
    assert noise.dtype == torch.float32
    assert 0.0 < noise.min().item() and noise.max().item() < 1.0
    buckets = (noise * 64).long().flatten()
    assert_distribution(buckets, torch.full((64,), 1 / 64))
    assert abs(noise.mean().item() - 0.5) < 3e-3
    assert (exponential_noise(torch.arange(4), torch.zeros(4, dtype=torch.int64), 100) > 0).all()


def test_noise_depends_only_on_seed_step_and_token() -> None:
    seeds = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    steps = torch.tensor([0, 7, 7, 8, 2, 0, 100, 5])
    full = uniform_noise(seeds, steps, 500)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(uniform_noise(seeds[perm], steps[perm], 500), full[perm])
    for i in range(8):
        assert torch.equal(uniform_noise(seeds[i : i + 1], steps[i : i + 1], 500), full[i : i + 1])
    # A wider (padded) vocabulary does not change the noise of existing tokens.
    assert torch.equal(uniform_noise(seeds, steps, 640)[:, :500], full)
    # Same seed on different steps, or the same step on other seeds, differ.
    assert not torch.equal(full[1], full[3])
    assert not torch.equal(full[1], full[2])


def test_sample_matches_probs_over_seeds(assert_distribution) -> None:
    probs = PROBS.expand(NUM_DRAWS, -1)
    samples = sample_from_probs(probs, torch.arange(NUM_DRAWS), _repeat(3, NUM_DRAWS))
    assert_distribution(samples, PROBS)


def test_sample_matches_probs_over_steps(assert_distribution) -> None:
    probs = PROBS.expand(NUM_DRAWS, -1)
    samples = sample_from_probs(probs, _repeat(1234, NUM_DRAWS), torch.arange(NUM_DRAWS))
    assert_distribution(samples, PROBS)


@pytest.mark.parametrize("vary", ["step", "seed"])
def test_consecutive_draws_are_independent(vary: str, assert_distribution) -> None:
    # Joint counts of (draw at i, draw at i+1) must match the product of marginals.
    probs = torch.full((NUM_DRAWS, 4), 0.25)
    counter = torch.arange(NUM_DRAWS)
    fixed = _repeat(99, NUM_DRAWS)
    seeds, steps = (fixed, counter) if vary == "step" else (counter, fixed)
    samples = sample_from_probs(probs, seeds, steps)
    pairs = samples[:-1] * 4 + samples[1:]
    assert_distribution(pairs, torch.full((16,), 1 / 16))


def test_same_seed_and_step_gives_same_token() -> None:
    probs = torch.softmax(torch.randn(1, 1000, generator=torch.Generator().manual_seed(1)), dim=-1)
    seeds, steps = torch.tensor([77]), torch.tensor([12])
    first = sample_from_probs(probs, seeds, steps)
    assert torch.equal(sample_from_probs(probs, seeds, steps), first)
    others = sample_from_probs(probs.expand(50, -1), _repeat(77, 50), torch.arange(50) + 13)
    assert others.unique().numel() > 10  # other steps give fresh draws


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_noise_bits_identical_on_cuda() -> None:
    seeds = torch.tensor([0, 1, -1, 2**62, -(2**63), 123456789])
    steps = torch.tensor([0, 1, 2**31, 5, 17, 2**50])
    cpu = uniform_noise(seeds, steps, 151_936)
    cuda = uniform_noise(seeds.cuda(), steps.cuda(), 151_936).cpu()
    assert torch.equal(cpu.view(torch.int32), cuda.view(torch.int32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_noise_matches_eager() -> None:
    seeds = torch.arange(16, device="cuda") * 7919 - 123456789
    steps = torch.arange(16, device="cuda")
    counters = token_counters(32_000, "cuda")
    compiled = torch.compile(uniform_noise, dynamic=False)(seeds, steps, 32_000, counters)
    assert torch.equal(compiled, uniform_noise(seeds, steps, 32_000))
