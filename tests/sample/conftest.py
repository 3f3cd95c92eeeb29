"""Shared helpers for the sampler tests (fixtures, so they work under any pytest import mode)."""

import math
from collections.abc import Callable

import pytest
import torch

# z-score of the upper 1e-5 tail: with fixed seeds the tests are deterministic, and a
# correct sampler sits far below this bound, while a wrong distribution lands far above it.
_Z = 4.265


def chi_square_statistic(counts: torch.Tensor, expected_probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic and degrees of freedom over the cells with expected mass > 0."""
    counts, expected_probs = counts.double(), expected_probs.double()
    total = counts.sum()
    support = expected_probs > 0
    assert counts[~support].sum() == 0, "sampled a token outside the support"
    expected = expected_probs[support] * total
    statistic = ((counts[support] - expected) ** 2 / expected).sum().item()
    return statistic, int(support.sum().item()) - 1


def chi_square_critical(df: int) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at 1 - 1e-5."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + _Z * math.sqrt(a)) ** 3


@pytest.fixture
def assert_distribution() -> Callable[[torch.Tensor, torch.Tensor], None]:
    """assert_distribution(samples [N] int64, probs [V]): support and chi-square fit."""

    def check(samples: torch.Tensor, probs: torch.Tensor) -> None:
        counts = torch.bincount(samples, minlength=probs.numel())
        statistic, df = chi_square_statistic(counts, probs)
        if df == 0:
            return
        assert statistic < chi_square_critical(df), (statistic, df, counts.tolist(), probs.tolist())

    return check
