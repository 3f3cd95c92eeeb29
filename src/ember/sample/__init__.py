"""Batched, seeded, batch-independent token sampling."""

from ember.sample.metadata import Penalties, SamplingMetadata, SamplingRow, TokenBias
from ember.sample.random import exponential_noise, sample_from_probs, token_counters, uniform_noise
from ember.sample.sampler import LogprobsTensors, Sampler, SamplerOutput, compute_logprobs

__all__ = [
    "LogprobsTensors",
    "Penalties",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "SamplingRow",
    "TokenBias",
    "compute_logprobs",
    "exponential_noise",
    "sample_from_probs",
    "token_counters",
    "uniform_noise",
]
