#!/usr/bin/env python3
"""Paired statistics for the synthetic pipeline's report (cluster/synth/report.py): every model is
evaluated on the same NIAH items (hydra eval-niah with one --seed: an item is (task, length, depth,
sample)), so two arms are compared item by item, not as two independent proportions.

  mcnemar_exact(b, c)        two-sided exact McNemar p-value: b items right only under A, c only under B
  paired_difference(A, B)    A and B are lists of members (training seeds, random draws), each a dict
                             item -> 0/1. The per-item accuracy of an arm is the mean over its members;
                             the difference is the mean over shared items of A's minus B's, with a 95%
                             interval from a paired bootstrap that resamples items and, within each
                             arm, members (so seed-to-seed spread widens the interval), never narrower
                             than ±3/n (the rule of three); plus McNemar's exact p when each arm has one member.
  verdict(lo, hi, margin)    "A better" / "B better" when the interval excludes 0; "equivalent (±margin)"
                             when it lies inside (−margin, +margin); else "undecided".
  spearman(x, y)             Spearman's ρ (average ranks for ties) with a 95% bootstrap interval over pairs.
  mcnemar_power(n, pa, pb)   the power of the exact McNemar test at α = 0.05 on n shared items when
                             the arms' accuracies are pa and pb and their errors independent (the
                             most discordant case; correlated errors give fewer discordant pairs and
                             a test at least as sharp for the same difference).
  python3 stats.py power     the power table the ablation plan was sized with (plans/README.md).
Standard library only.
"""
import math
import random
import sys

ALPHA = 0.05
RESAMPLES = 2000  # bootstrap resamples of paired_difference (tests of the report's logic may take fewer)


def binom_pmf(k, n, p):
    if p <= 0:
        return 1.0 if k == 0 else 0.0
    if p >= 1:
        return 1.0 if k == n else 0.0
    return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p))


def mcnemar_exact(b, c):
    """Two-sided exact McNemar p-value: under H0 the b + c discordant items split Binomial(b + c, 1/2)."""
    m = b + c
    if m == 0:
        return 1.0
    k = min(b, c)
    tail = sum(binom_pmf(i, m, 0.5) for i in range(k + 1))
    return min(1.0, 2 * tail)


def _mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def _arm_item_means(members, items):
    return [_mean([m[i] for m in members]) for i in items]


def paired_difference(arm_a, arm_b, items=None, resamples=None, seed=12345):
    """Mean accuracy difference A − B on the items every member of both arms has, with a 95% paired
    bootstrap interval (items resampled; members resampled within each arm when it has several).
    Returns a dict: diff, lo, hi, items, acc_a, acc_b, members_a, members_b, and b, c, p_mcnemar when
    both arms have one member. None when there are no shared items."""
    if not arm_a or not arm_b:
        return None
    shared = set.intersection(*(set(m) for m in arm_a + arm_b))
    if items is not None:
        shared &= set(items)
    shared = sorted(shared)
    if not shared:
        return None
    a = _arm_item_means(arm_a, shared)
    b = _arm_item_means(arm_b, shared)
    diff = _mean(a) - _mean(b)
    resamples = resamples or RESAMPLES
    rng = random.Random(seed)
    n = len(shared)
    boots = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        ma = [arm_a[rng.randrange(len(arm_a))] for _ in arm_a] if len(arm_a) > 1 else arm_a
        mb = [arm_b[rng.randrange(len(arm_b))] for _ in arm_b] if len(arm_b) > 1 else arm_b
        sa = sum(_mean([m[shared[i]] for m in ma]) for i in idx) / n
        sb = sum(_mean([m[shared[i]] for m in mb]) for i in idx) / n
        boots.append(sa - sb)
    boots.sort()
    # Never narrower than ±3/n around the estimate: with no discordant item among n the bootstrap
    # collapses to a point, yet a discordance rate up to 3/n is still plausible (the rule of three).
    lo = max(-1.0, min(boots[int(0.025 * resamples)], diff - 3 / n))
    hi = min(1.0, max(boots[min(resamples - 1, int(0.975 * resamples))], diff + 3 / n))
    out = {"diff": diff, "lo": lo, "hi": hi,
           "items": n, "acc_a": _mean(a), "acc_b": _mean(b), "members_a": len(arm_a), "members_b": len(arm_b)}
    if len(arm_a) == 1 and len(arm_b) == 1:
        bb = sum(1 for i in shared if arm_a[0][i] and not arm_b[0][i])
        cc = sum(1 for i in shared if arm_b[0][i] and not arm_a[0][i])
        out.update({"b": bb, "c": cc, "p_mcnemar": mcnemar_exact(bb, cc)})
    return out


def verdict(lo, hi, margin):
    if lo is None or hi is None:
        return "missing data"
    if lo > 0:
        return "A better"
    if hi < 0:
        return "B better"
    if -margin < lo and hi < margin:
        return f"equivalent (within ±{margin:g})"
    return "undecided"


def ranks(xs):
    """Average ranks (1-based), ties sharing the mean of their positions."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def pearson(x, y):
    mx, my = _mean(x), _mean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return float("nan")
    return sxy / math.sqrt(sxx * syy)


def spearman(x, y, resamples=2000, seed=12345):
    """(ρ, lo, hi): Spearman's rank correlation and its 95% bootstrap interval over the pairs."""
    if len(x) != len(y) or len(x) < 3:
        return None
    rho = pearson(ranks(x), ranks(y))
    rng = random.Random(seed)
    boots = []
    for _ in range(resamples):
        idx = [rng.randrange(len(x)) for _ in x]
        v = pearson(ranks([x[i] for i in idx]), ranks([y[i] for i in idx]))
        if not math.isnan(v):
            boots.append(v)
    boots.sort()
    if not boots:
        return rho, float("nan"), float("nan")
    return rho, boots[int(0.025 * len(boots))], boots[min(len(boots) - 1, int(0.975 * len(boots)))]


def mcnemar_power(n, pa, pb, alpha=ALPHA):
    """Exact power of the two-sided exact McNemar test on n items, errors independent across arms."""
    p10, p01 = pa * (1 - pb), pb * (1 - pa)
    pd = p10 + p01
    if pd == 0:
        return 0.0
    q = p10 / pd
    # The rejection region for each discordant count m: b with p(b, m − b) < alpha.
    power = 0.0
    for m in range(n + 1):
        pm = binom_pmf(m, n, pd)
        if pm < 1e-12:
            continue
        region = [b for b in range(m + 1) if mcnemar_exact(b, m - b) < alpha]
        power += pm * sum(binom_pmf(b, m, q) for b in region)
    return power


def power_table():
    """The table the ablation plan was sized with: items per comparison vs the power to see a difference."""
    rows = []
    for n in (40, 80, 120, 240, 480):
        cells = [mcnemar_power(n, pa, pb) for pa, pb in ((0.95, 0.80), (0.90, 0.70), (0.80, 0.60), (0.60, 0.40), (0.95, 0.90))]
        rows.append((n, cells))
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "power":
        print("exact McNemar, alpha 0.05, errors independent: power to detect A vs B on n shared items")
        print("| items | 0.95 vs 0.80 | 0.90 vs 0.70 | 0.80 vs 0.60 | 0.60 vs 0.40 | 0.95 vs 0.90 |")
        print("|---|---|---|---|---|---|")
        for n, cells in power_table():
            print(f"| {n} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    else:
        print(__doc__)
