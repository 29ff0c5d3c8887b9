"""ARL0 of pp_tail_stall's CUSUM on healthy readings: a Markov chain (Brook & Evans 1972).

Lorden's bound (soak.detect.evidence) holds under the fitted healthy model with
independent readings; real readings are not independent (a tail dip lasts a few
readings, the progress clock counts up). This module estimates the average run
length of ``S = max(0, S + X_t)`` to reach the bound ``h`` from healthy readings:

- **Readings.** A reading is its joint bin ``(tail bin, progress bin or None)`` (None:
  nothing in flight, progress not scored) and its weight; its increment is
  ``weight x`` the table's log-likelihood ratio for the bins
  (``EvidenceTable.increment``, the live rule's own weights), and it stands for
  ``weight x period_s`` of busy time (a longer gap counts as one period: the ARL in
  hours is then an underestimate). A progress move during the pattern (``MOVED``)
  ends the excursion: the chain sends S to 0.
- **Dependence.** A first-order Markov chain over joint bins, factorised as
  ``P(b' | b) = P(progress' | progress) x P(tail' | tail, class(progress'))`` with
  class fresh / quiet / none (the table's own conditioning: the tail's ratio is taken
  given fresh progress). Each row is a Dirichlet posterior mean with Jeffreys' prior
  mass (0.5 per outcome, 0.5 k in all) centred on the row pooled over the previous
  bin rather than spread uniformly (MacKay & Peto's hierarchical Dirichlet). For the
  progress that pooled row is Jeffreys' ``(count + 0.5) / (n + 0.5 k)``; for the tail it
  is the class's counts with the same mass centred on the tail's law over every class
  (Jeffreys), a third level: a class the source hardly saw (quiet progress in three
  minutes of a fast GPU run) reads like the source's tail in general, as the table
  itself scores a tail beside anything but fresh progress by its unconditional healthy
  law, not as a coin that stalls one reading in three. An outcome the row never showed is at
  least as likely as in the pooled row (else two rows that never showed it would
  multiply their ignorance). A row rich in data is its data; a row seen a few times
  or never (a tail bin hardly ever seen in healthy load, say ``partial`` or ``stall``)
  leans on the pooled row: without evidence, the next reading is like any healthy
  reading, as Lorden's bound assumes. Then each tail probability is at least the
  table's healthy floor for that bin (``healthy[tail_pattern|fresh_progress]`` beside fresh progress,
  ``healthy[tail_pattern|nothing_in_flight]`` with nothing in flight,
  ``healthy[tail_pattern]`` otherwise), rows renormalised: the larger of the two,
  counted in ``floored``. ``worst_h`` takes Jeffreys proper instead (prior uniform: a
  row never seen is uniform, a healthy stall that persists one reading in three).
- **Weights.** Drawn independently of the bins from the readings' weights (to a
  0.05 grid): a weight is the sampling cadence, not the load.
- **Chain.** S on ``[0, h)`` in steps of ``delta`` (at most ``max_states`` states
  ``(cell, last bin)``; near 0.05 for h = 18 by default); each increment rounded *up*
  to the grid, so the discrete sum never lags the real one and the chain's ARL does
  not overstate the model's;
  absorbing at ``>= h`` (also on a reading with nothing in flight, where the live rule
  waits for requests before it decides: again an underestimate). ``(I - Q) L = 1``
  (scipy.sparse) on the states from which the bound is reached surely (elsewhere the
  ARL is infinite), started at S = 0 with the last bin drawn from the chain's
  stationary law.
- **Homogeneity.** ``homogeneity`` asks whether two sources' transitions could come
  from one law (a two-sample G test per row, permutation p-value): where they could
  not, pooling them would let the larger speak for the smaller, so each is estimated
  on its own readings.
- **Interval.** 90%: the 5th and 95th percentiles of the same estimate over ``draws``
  bootstrap resamples of the transition counts (seeded): each row's counts redrawn
  Multinomial(its total, its observed frequencies) and the chain refitted (the
  bootstrap for Markov chains of Kulperger & Prakasa Rao), each solved on a grid
  twice as coarse. It is the observed counts' sampling error, not the prior's: a
  transition never seen stays unseen in every resample; ``worst_h`` is the figure for
  the one choice the data cannot settle.

Pure: no clock, no I/O; the same readings and seed give the same figures.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from soak.detect import evidence as ev

NONE = "none"  # progress not scored: nothing in flight
CLASSES = ("fresh", "quiet", NONE)
WEIGHT_GRID = 0.05
JEFFREYS = 0.5
# ~0.4 s a solve (scipy's sparse LU grows about as the cube): 6000 states put delta near
# 0.05 for h = 18 and 18 joint bins, small beside increments of 2-15.
MAX_STATES = 6_000

Bin = tuple  # (tail bin, progress bin or None)
Reading = tuple  # (bins mapping as ev.step sees it, weight)


def progress_class(progress: str | None) -> str:
    if progress is None:
        return NONE
    return "fresh" if progress in ev.FRESH else "quiet"


def joint_bins(table: ev.EvidenceTable, seen: Iterable[Bin] = ()) -> tuple[Bin, ...]:
    """Every tail bin the table knows x every age bin and None, plus any bin seen."""
    tails = list(dict.fromkeys([*table.llr.get(ev.TAIL, {}), *table.healthy.get(ev.TAIL, {})]))
    progress: list[str | None] = [*ev.AGE_BINS, None]
    out = list(dict.fromkeys((t, p) for t in tails for p in progress))
    for b in seen:
        if b not in out:
            out.append(b)
    return tuple(out)


def increment(table: ev.EvidenceTable, b: Bin) -> float:
    """The reading's increment at weight 1; -inf for a progress move (the excursion ends)."""
    tail, progress = b
    if progress == ev.MOVED:
        return -math.inf
    bins = {ev.TAIL: tail} if progress is None else {ev.TAIL: tail, ev.PROGRESS: progress}
    return sum(table.increment(bins).values())


def as_bin(bins: Mapping[str, str]) -> Bin:
    return bins.get(ev.TAIL), bins.get(ev.PROGRESS)


@dataclass(frozen=True)
class Counts:
    """Transition counts of healthy readings, per trace (no transition across traces)."""

    progress: Mapping[tuple, int]  # (progress, progress') -> n
    tail: Mapping[tuple, int]  # (tail, class(progress'), tail') -> n
    weights: Mapping[float, int]  # weight on the grid -> n
    bins: Mapping[Bin, int]  # joint bin -> n
    readings: int
    busy_s: float  # sum of weight x period over readings with progress scored


def count(sequences: Iterable[Sequence[Reading]], *, period_s: float) -> Counts:
    progress: dict = {}
    tail: dict = {}
    weights: dict = {}
    bins: dict = {}
    readings, busy = 0, 0.0
    for seq in sequences:
        last: Bin | None = None
        for raw, weight in seq:
            b = as_bin(raw)
            if b[0] is None:
                continue
            w = max(WEIGHT_GRID, round(min(1.0, max(0.0, weight)) / WEIGHT_GRID) * WEIGHT_GRID)
            weights[w] = weights.get(w, 0) + 1
            bins[b] = bins.get(b, 0) + 1
            readings += 1
            if b[1] is not None:
                busy += w * period_s
            if last is not None:
                progress[(last[1], b[1])] = progress.get((last[1], b[1]), 0) + 1
                key = (last[0], progress_class(b[1]), b[0])
                tail[key] = tail.get(key, 0) + 1
            last = b
    return Counts(progress, tail, weights, bins, readings, busy)


def _rows(counts: Sequence[Sequence[float]], *, shrink: bool,
          top: Sequence[float] | None = None) -> tuple[list[np.ndarray], int]:
    """Each row's posterior mean under Dirichlet(0.5 k x base): base the pooled row's own
    posterior mean (``shrink``) or uniform (Jeffreys proper). Also the number of rows with
    no data (they are their base)."""
    c = np.asarray(counts, dtype=float)
    k = c.shape[1]
    # The pooled row itself: Jeffreys' mass centred on ``top`` (a level above: the tail's law
    # over every class), uniform where there is none.
    pooled = c.sum(axis=0) + JEFFREYS * k * (np.full(k, 1.0 / k) if top is None else np.asarray(top, dtype=float))
    base = pooled / pooled.sum() if shrink else np.full(k, 1.0 / k)
    alpha = JEFFREYS * k * base
    rows = []
    for row in c:
        p = (row + alpha) / (row.sum() + alpha.sum())
        if shrink:  # an outcome the row never showed: as likely as in the pool, not its square
            p = np.where(row > 0, p, np.maximum(p, base))
        rows.append(p / p.sum())
    return rows, int((c.sum(axis=1) <= 0).sum())


def _floored(p: np.ndarray, floors: np.ndarray) -> tuple[np.ndarray, int]:
    raised = floors > p
    q = np.maximum(p, floors)
    return q / q.sum(), int(raised.sum())


@dataclass(frozen=True)
class Chain:
    bins: tuple[Bin, ...]
    transition: np.ndarray  # k x k, row: last bin, column: next bin
    floored: int  # tail probabilities raised to the table's healthy floor
    unobserved: int  # rows with no data: their prior alone


def _axes(table: ev.EvidenceTable, *seen: Mapping[Bin, int]) -> tuple[tuple[Bin, ...], tuple, tuple]:
    # The extra bins (beyond the table's) in one order whichever source comes first, so
    # two sources' counts lie on the same axes (homogeneity).
    bins = joint_bins(table, sorted({b for s in seen for b in s}, key=repr))
    return bins, tuple(dict.fromkeys(t for t, _ in bins)), tuple(dict.fromkeys(p for _, p in bins))


def _tail_top(counts: Counts, tails: Sequence[str]) -> np.ndarray:
    """The tail's law over every class and last tail (Jeffreys): what a class's pooled row
    leans on where that class was seen little or never. The table makes the same
    assumption: it scores the tail given anything but fresh progress by its unconditional
    healthy law."""
    n = np.asarray([sum(v for (_, _, b), v in counts.tail.items() if b == t) for t in tails], dtype=float) + JEFFREYS
    return n / n.sum()


def fit(counts: Counts, table: ev.EvidenceTable, *, unobserved: str = "pooled") -> Chain:
    """The transition matrix. ``unobserved``: "pooled" (each row shrunk towards the pooled
    row of its class, that towards the tail's law over every class) or "uniform" (Jeffreys
    proper: a row with no data is uniform)."""
    bins, tails, progs = _axes(table, counts.bins)
    floors = {}
    for cls in CLASSES:
        row = {"fresh": ev.TAIL_GIVEN_FRESH, NONE: ev.TAIL_GIVEN_IDLE}.get(cls, ev.TAIL)
        given = table.healthy.get(row) or table.healthy.get(ev.TAIL, {})
        floors[cls] = np.array([float(given.get(t, 0.0)) for t in tails])
    shrink = unobserved == "pooled"
    progress = [[counts.progress.get((a, b), 0) for b in progs] for a in progs]
    prog_rows, backed = _rows(progress, shrink=shrink)
    tail_rows: dict = {}
    floored = 0
    top = _tail_top(counts, tails) if shrink else None
    for cls in CLASSES:
        rows, n_unseen = _rows([[counts.tail.get((a, cls, b), 0) for b in tails] for a in tails], shrink=shrink,
                               top=top)
        backed += n_unseen
        for a, r in zip(tails, rows):
            tail_rows[(a, cls)], n = _floored(r, floors[cls])
            floored += n
    k = len(bins)
    P = np.zeros((k, k))
    for i, (ta, pa) in enumerate(bins):
        prow = prog_rows[progs.index(pa)]
        for j, (tb, pb) in enumerate(bins):
            P[i, j] = prow[progs.index(pb)] * tail_rows[(ta, progress_class(pb))][tails.index(tb)]
    P /= P.sum(axis=1, keepdims=True)
    return Chain(bins, P, floored, backed)


@dataclass(frozen=True)
class Homogeneity:
    """Whether two sources' transitions could come from one law: the G statistic of each
    row's 2 x k table (this source against the other), summed, its Monte Carlo p-value
    under the permutation null, the same per factor (progress, tail), and the row that
    departs most."""

    g: float
    p: float
    rows: int
    transitions: int
    worst: str
    by_factor: Mapping[str, tuple[float, float]]  # "progress" / "tail" -> (G, p)
    draws: int

    @property
    def p_floor(self) -> float:
        """The smallest p-value ``draws`` can give: a p at it reads "p <= floor"."""
        return 1.0 / (self.draws + 1)


def _g_two_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """G of 2 x k tables, source rows ``a`` (..., k) against rows ``b`` (k) or (..., k)."""
    both = a + b
    n_a, n_b = a.sum(axis=-1, keepdims=True), b.sum(axis=-1, keepdims=True)
    n = n_a + n_b
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = (np.where(a > 0, a * np.log(a * n / (n_a * both)), 0.0)
                 + np.where(b > 0, b * np.log(b * n / (n_b * both)), 0.0))
    return 2.0 * terms.sum(axis=-1)


def homogeneity(counts: Counts, other: Counts, table: ev.EvidenceTable, *, draws: int = 2000,
                seed: int = 0) -> Homogeneity:
    """A two-sample test, symmetric in the sources: for every row both saw (progress given
    progress; tail given tail and class), the 2 x k table of next-bin counts, G of its
    independence; the p-value by redrawing each row's split between the sources at its
    observed column totals (the multivariate hypergeometric: the permutation null, exact
    for small counts where the chi-square approximation fails), ``draws`` times. Neither
    side is taken as the known law, so a small population cannot make a large source
    look different."""
    _, tails, progs = _axes(table, counts.bins, other.bins)
    cells: list[tuple[str, str, np.ndarray, np.ndarray]] = []
    for a in progs:
        cells.append(("progress", f"progress after {a}",
                      np.asarray([counts.progress.get((a, b), 0) for b in progs]),
                      np.asarray([other.progress.get((a, b), 0) for b in progs])))
    for cls in CLASSES:
        for a in tails:
            cells.append(("tail", f"tail after {a} ({cls} progress)",
                          np.asarray([counts.tail.get((a, cls, b), 0) for b in tails]),
                          np.asarray([other.tail.get((a, cls, b), 0) for b in tails])))
    cells = [c for c in cells if c[2].sum() > 0 and c[3].sum() > 0]  # a row one side never saw says nothing
    rng = np.random.default_rng(seed)
    observed, drawn = [], []
    for _, _, a, b in cells:
        observed.append(float(_g_two_rows(a.astype(float), b.astype(float))))
        total = (a + b).astype(np.int64)
        split = rng.multivariate_hypergeometric(total, int(a.sum()), size=draws).astype(float)
        drawn.append(_g_two_rows(split, total.astype(float) - split))

    def test(which: list[int]) -> tuple[float, float]:
        g = float(sum(observed[i] for i in which))
        null = sum((drawn[i] for i in which), np.zeros(draws))
        return g, float((1 + (null >= g - 1e-9).sum()) / (draws + 1))

    g, p = test(list(range(len(cells))))
    by_factor = {f: test([i for i, c in enumerate(cells) if c[0] == f]) for f in ("progress", "tail")}
    worst = cells[int(np.argmax(observed))][1] if cells else ""
    transitions = int(sum(a.sum() for f, _, a, _ in cells if f == "progress"))  # each once, not per factor
    return Homogeneity(g, p, len(cells), transitions, worst, by_factor, draws)


def resample(counts: Counts, rng: np.random.Generator) -> Counts:
    """Counts as the same readings might have given them: each row's total kept, its
    outcomes drawn Multinomial(total, the row's observed frequencies) (the bootstrap of
    a Markov chain's transition counts; a transition never seen stays unseen, and its
    prior alone speaks for it)."""

    def draw(observed: Mapping[tuple, int], width: int) -> dict:
        rows: dict = {}
        for key, n in observed.items():
            rows.setdefault(key[:width], []).append((key, n))
        out: dict = {}
        for cells in rows.values():
            p = np.asarray([n for _, n in cells], dtype=float)
            for (key, _), m in zip(cells, rng.multinomial(int(p.sum()), p / p.sum())):
                if m:
                    out[key] = int(m)
        return out

    return Counts(draw(counts.progress, 1), draw(counts.tail, 2), counts.weights, counts.bins, counts.readings,
                  counts.busy_s)


def stationary(P: np.ndarray) -> np.ndarray:
    k = P.shape[0]
    A = np.vstack([P.T - np.eye(k), np.ones(k)])
    pi, *_ = np.linalg.lstsq(A, np.r_[np.zeros(k), 1.0], rcond=None)
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def chain_arl(P: np.ndarray, increments: Sequence[float], *, bound: float,
              weights: Mapping[float, float] | None = None, start: Sequence[float] | None = None,
              max_states: int = MAX_STATES, delta: float | None = None) -> tuple[float, float]:
    """(readings to reach ``bound``, delta): Brook & Evans over (cell of S, last bin).

    ``P[a, b]``: the next reading's bin b given the last a; ``increments[b]`` at weight
    1 (-inf: reset to 0); ``weights``: weight -> probability, independent of the bins;
    ``delta``: the grid (default: as fine as ``max_states`` allows). inf when the bound
    cannot be reached."""
    from scipy.sparse import coo_matrix, identity
    from scipy.sparse.linalg import spsolve

    P = np.asarray(P, dtype=float)
    k = P.shape[0]
    if bound <= 0:
        return 1.0, 0.0
    most = max(1, max_states // max(k, 1))
    m = most if delta is None or delta <= 0 else min(most, max(1, math.ceil(bound / delta - 1e-9)))
    delta = bound / m
    wts = weights or {1.0: 1.0}
    shifts: list[dict[int, float]] = []  # per next bin: shift in cells -> probability
    for x in increments:
        per: dict[int, float] = {}
        for w, q in wts.items():
            s = -m if x == -math.inf else math.ceil(w * x / delta - 1e-9)
            per[s] = per.get(s, 0.0) + q
        shifts.append(per)
    cells = np.arange(m)
    rows, cols, vals = [], [], []
    for a in range(k):
        for b in range(k):
            if P[a, b] <= 0:
                continue
            for s, q in shifts[b].items():
                to = np.maximum(cells + s, 0)
                keep = to < m
                rows.append(a * m + cells[keep])
                cols.append(b * m + to[keep])
                vals.append(np.full(int(keep.sum()), P[a, b] * q))
    n = k * m
    Q = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n)).tocsr()
    finite = _absorbed_surely(Q)
    L = np.full(n, math.inf)
    if finite.any():
        sub = Q[finite][:, finite].tocsc()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            L[finite] = spsolve((identity(int(finite.sum()), format="csc") - sub).tocsc(), np.ones(int(finite.sum())))
    pi = np.asarray(start, dtype=float) if start is not None else stationary(P)
    arl = float(sum(pi[a] * L[a * m] for a in range(k) if pi[a] > 0))
    if not math.isfinite(arl) or arl <= 0:
        return math.inf, delta
    return max(arl, 1.0), delta


def _reaching(graph, targets: np.ndarray) -> np.ndarray:
    """States with a path (``graph[i, j] > 0``: i -> j) into ``targets``."""
    reach = targets.copy()
    while True:  # graph @ reach marks the states with a successor in reach
        grown = reach | (graph @ reach.astype(float) > 0)
        if (grown == reach).all():
            return reach
        reach = grown


def _absorbed_surely(Q) -> np.ndarray:
    """States from which the bound is reached with probability 1: those that cannot
    reach a set of states that never reaches it (there the ARL is infinite; left in,
    I - Q is singular)."""
    leaks = np.asarray(Q.sum(axis=1)).ravel() < 1.0 - 1e-12
    trapped = ~_reaching(Q, leaks)
    return ~_reaching(Q, trapped)


@dataclass(frozen=True)
class ArlEstimate:
    """ARL0 in busy hours: the point, the 90% interval, the worst case (unobserved rows uniform)."""

    hours: float
    low_h: float
    high_h: float
    worst_h: float
    readings: int  # healthy readings behind it
    busy_h: float  # their busy (scored) time
    floored: int
    unobserved: int
    delta: float
    states: int
    draws: int


def estimate(sequences: Iterable[Sequence[Reading]], *, table: ev.EvidenceTable, bound: float,
             draws: int = 30, seed: int = 0, max_states: int = MAX_STATES) -> ArlEstimate:
    counts = count(sequences, period_s=table.period_s)
    total = sum(counts.weights.values())
    weights = {w: n / total for w, n in counts.weights.items()} if total else {1.0: 1.0}
    mean_w_s = sum(w * q for w, q in weights.items()) * table.period_s
    # ARL0 is stated per hour of healthy *load*: a run of readings also spans the idle ones
    # (nothing in flight), so its hours count only the busy share of the time read.
    read_s = sum(w * n for w, n in counts.weights.items()) * table.period_s
    busy_share = min(1.0, counts.busy_s / read_s) if read_s > 0 else 1.0

    def hours(chain: Chain, states: int = max_states) -> tuple[float, float]:
        incs = [increment(table, b) for b in chain.bins]
        readings, delta = chain_arl(chain.transition, incs, bound=bound, weights=weights, max_states=states)
        return readings * mean_w_s * busy_share / 3600.0, delta

    point = fit(counts, table)
    h, delta = hours(point)
    worst, _ = hours(fit(counts, table, unobserved="uniform"))
    rng = np.random.default_rng(seed)
    # Draws on a coarser grid (half the states), scaled by the point's own coarse/fine ratio
    # so the grid's bias does not move the interval off the point.
    coarse, _ = hours(point, max_states // 2)
    scale = h / coarse if coarse > 0 and math.isfinite(coarse) and math.isfinite(h) else 1.0
    drawn = sorted(scale * hours(fit(resample(counts, rng), table), max_states // 2)[0]
                   for _ in range(draws))
    lo = float(np.percentile(drawn, 5)) if drawn else h
    hi = float(np.percentile(drawn, 95)) if drawn else h
    k = len(point.bins)
    return ArlEstimate(h, lo, hi, worst, counts.readings, counts.busy_s / 3600.0, point.floored, point.unobserved,
                       delta, k * max(1, max_states // k), draws)


__all__ = ["ArlEstimate", "Chain", "Counts", "Homogeneity", "as_bin", "chain_arl", "count", "estimate", "fit",
           "homogeneity", "increment", "joint_bins", "progress_class", "resample", "stationary"]
