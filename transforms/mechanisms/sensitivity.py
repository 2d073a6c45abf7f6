"""The one seam through which every mechanism gets its sensitivity on S_{D,k}.

S_{D,k} (seed 004, Sec. 7) holds the changes one protected unit can make to a difference stream:
vectors whose l1 norm is at most k (`max_contributions`) and whose interval sums are bounded by D
(`interval_bound`). On S_{1,1} the sensitivity is the largest column l_p norm of R, which each
mechanism computes exactly. For larger sets this module returns the triangle-inequality bound
||R v||_p <= ||v||_1 * max_j ||R e_j||_p <= k * column_norm, valid for every vector of S_{D,k}
(never an under-estimate); the exact tree dynamic programs and Thm 8.4 for the square root
replace it here without touching the mechanisms.
"""
from __future__ import annotations


def sensitivity(mechanism, p: int, max_contributions: int, interval_bound: int) -> float:
    base = mechanism.column_norm(p)
    if max_contributions == 1:
        return base
    return max_contributions * base
