"""Paired statistics for comparing two serving configs: pure functions on numpy arrays.

Proportions (flips, McNemar, Tango/Newcombe CIs, non-inferiority), paired means with
cluster-robust SEs and bootstrap CIs, output-length comparisons, Holm, single-proportion
CIs, sample sizes. No I/O; randomness only through a passed-in `numpy.random.Generator`.
scipy/statsmodels do the work where they can; formulas and sources: docs/statistics.md.
The modules: core (the returned values, normal and t functions), proportions (paired 2x2, Holm,
single proportions), means (paired means, bootstrap, Hall, sample sizes), betting (UpperBet),
lengths (output-length comparisons), fieller (ratio of two independent means).
"""

from __future__ import annotations

# the modules by concern; the distribution functions and BET_TRUNCATION are re-exported too (the gate
# reads them as `st.norm_sf`, `st.BET_TRUNCATION`, ...)
from kvqual.stats.betting import BET_TRUNCATION, UpperBet
from kvqual.stats.core import (Interval, MeanDiff, NonInferiority, PairedCounts, TestResult, norm_cdf, norm_isf,
                               norm_sf, t_cdf, t_isf, t_ppf)
from kvqual.stats.fieller import Estimate, fieller_ratio_ci, fieller_t
from kvqual.stats.lengths import hodges_lehmann, ks_gap, ks_two_sample, ratio_of_means_ci, wilcoxon_signed_rank
from kvqual.stats.means import (cluster_skewness, hall_inverse, hall_transform, mean_ci, n_more_to_decide,
                                paired_bootstrap_ci, paired_mean_diff, sample_size)
from kvqual.stats.proportions import (clopper_pearson_ci, holm_adjust, mcnemar_exact_p, newcombe_ci, paired_counts,
                                      paired_noninferiority, stratified_score_ci, stratified_score_z, tango_ci,
                                      tango_unit_variance, tango_z, wilson_ci)

__all__ = [
    "Interval", "PairedCounts", "MeanDiff", "TestResult", "NonInferiority",
    "paired_counts", "mcnemar_exact_p", "tango_ci", "tango_z", "tango_unit_variance",
    "stratified_score_z", "stratified_score_ci", "newcombe_ci",
    "paired_noninferiority", "mean_ci", "paired_mean_diff", "paired_bootstrap_ci",
    "sample_size", "n_more_to_decide", "hall_transform", "hall_inverse", "cluster_skewness", "ratio_of_means_ci", "wilcoxon_signed_rank",
    "hodges_lehmann", "UpperBet", "ks_two_sample", "ks_gap", "Estimate", "fieller_ratio_ci", "fieller_t", "holm_adjust", "wilson_ci", "clopper_pearson_ci",
]
