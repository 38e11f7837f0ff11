"""Pearson's chi-square goodness of fit, with sparse cells pooled so the test is valid."""

import numpy as np
from scipy import stats


def chisquare_pvalue(counts, expected_probs, min_expected: float = 5.0) -> float:
    counts = np.asarray(counts, dtype=float).ravel()
    expected = np.asarray(expected_probs, dtype=float).ravel() * counts.sum()
    if counts[expected == 0].sum() > 0:
        return 0.0  # an outcome the target gives probability 0 was produced
    big = expected >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    if keep.sum() < 2:
        return 1.0  # a single possible outcome, and it was the only one produced
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)
