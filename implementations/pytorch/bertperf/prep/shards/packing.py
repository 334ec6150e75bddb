"""Histogram packing: up to K (<= 3) variable-length sequences per fixed-size row of L tokens, in
bounded memory (docs/design.md, "Training shards", gives the algorithm and its figures).
`histogram` counts the sequences of each length 1..L (from the shards' offsets: cheap);
`plan_packing(hist)` chooses row shapes (multisets of at most K lengths summing to <= L) and how
many rows of each, covering the histogram exactly (longest-first exact-fit: 99.7-99.8% of the row
capacity on Wikipedia-like lengths); `Packer` streams the sequences in input order and gives each
a slot in a planned row, holding only the sequences of rows not yet complete (at most about
2 * max_pending; beyond the cap, and where the plan has no place, sequences become "overflow",
packed in memory with a plan of its own). Deterministic: the same lengths in the same order (and
chunking) give the same rows. The packer deals in sequence ids (`refs`, by default each
sequence's index in the stream), never in tokens: callers keep the data of pending sequences and
look rows up by id."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertperf.formats.samples import offsets_from_lengths, ranges

MAX_SEQS_PER_ROW = 3
DEFAULT_MAX_PENDING = 1_000_000
_BATCH_DIVISOR = 8  # a plan step makes at most 1/8 of the remaining rows of its longest length


def histogram(lengths: np.ndarray, max_seq_length: int) -> np.ndarray:
    """Counts of lengths 0..max_seq_length (index = length), int64."""
    lengths = np.asarray(lengths)
    if lengths.size and (lengths.min() < 1 or lengths.max() > max_seq_length):
        bad = lengths[(lengths < 1) | (lengths > max_seq_length)][0]
        raise ValueError(f"sequence length {int(bad)} outside 1..{max_seq_length}")
    return np.bincount(lengths.astype(np.int64, copy=False), minlength=max_seq_length + 1)


# ---- the plan ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """Row shapes and their counts. shapes[s] holds the lengths of the sequences of a row of shape s
    in descending order, 0 for an empty place; counts[s] rows have that shape."""

    shapes: np.ndarray  # [S, K] int64
    counts: np.ndarray  # [S] int64
    max_seq_length: int

    @property
    def max_seqs_per_row(self) -> int:
        return int(self.shapes.shape[1])

    @property
    def sizes(self) -> np.ndarray:
        return (self.shapes > 0).sum(axis=1)

    @property
    def rows(self) -> int:
        return int(self.counts.sum())

    @property
    def sequences(self) -> int:
        return int((self.counts * self.sizes).sum())

    @property
    def tokens(self) -> int:
        return int((self.counts * self.shapes.sum(axis=1)).sum())

    @property
    def efficiency(self) -> float:
        """Real tokens / row capacity (rows * max_seq_length); 1.0 for no rows."""
        return self.tokens / (self.rows * self.max_seq_length) if self.rows else 1.0

    @property
    def seqs_per_row(self) -> float:
        return self.sequences / self.rows if self.rows else 0.0

    def histogram(self) -> np.ndarray:
        """The sequence-length histogram this plan covers."""
        h = np.zeros(self.max_seq_length + 1, dtype=np.int64)
        sizes = self.sizes
        lens = self.shapes[np.repeat(np.arange(len(sizes)), sizes), ranges(np.zeros_like(sizes), sizes)]
        np.add.at(h, lens, np.repeat(self.counts, sizes))
        return h

    def summary(self) -> dict:
        return {"rows": self.rows, "sequences": self.sequences, "tokens": self.tokens,
                "seqs_per_row": round(self.seqs_per_row, 6), "efficiency": round(self.efficiency, 6),
                "shapes": int(len(self.counts))}


def plan_packing(hist: np.ndarray, max_seqs_per_row: int = MAX_SEQS_PER_ROW,
                 max_seq_length: int | None = None) -> Plan:
    """The longest-first exact-fit plan for `hist` (counts indexed by length; hist[0] must be 0)."""
    h = np.array(hist, dtype=np.int64)
    L = len(h) - 1 if max_seq_length is None else int(max_seq_length)
    K = int(max_seqs_per_row)
    if not 1 <= K <= 3:
        raise ValueError(f"max_seqs_per_row must be 1, 2 or 3, not {K}")
    if len(h) > L + 1 and h[L + 1:].any():
        raise ValueError(f"histogram has sequences longer than {L}")
    h = np.concatenate([h[:L + 1], np.zeros(max(0, L + 1 - len(h)), dtype=np.int64)])
    if h[0]:
        raise ValueError("histogram has sequences of length 0")
    if (h < 0).any():
        raise ValueError("histogram has negative counts")
    made: dict[tuple[int, ...], int] = {}
    for l in range(L, 0, -1):
        while h[l] > 0:
            shape = _best_shape(h, l, L, K)
            use: dict[int, int] = {}
            for x in shape:
                use[x] = use.get(x, 0) + 1
            k = min(int(h[x]) // c for x, c in use.items())
            k = max(1, min(k, int(h[l]) // _BATCH_DIVISOR))
            for x, c in use.items():
                h[x] -= c * k
            made[shape] = made.get(shape, 0) + k
    keys = sorted(made, reverse=True)
    shapes = np.zeros((len(keys), K), dtype=np.int64)
    for i, key in enumerate(keys):
        shapes[i, :len(key)] = key
    return Plan(shapes, np.array([made[k] for k in keys], dtype=np.int64), L)


def _best_shape(h: np.ndarray, l: int, L: int, K: int) -> tuple[int, ...]:
    """The shape for the next rows led by length l (all lengths > l are used up)."""
    r = L - l
    if r == 0 or K == 1:
        return (l,)
    avail = h > 0  # a partner of length x exists (for x == l: besides the leader)
    avail[0] = False
    avail[l] = h[l] >= 2
    two = h >= 2  # two partners of length x exist
    two[l] = h[l] >= 3

    def triple(t: int) -> tuple[int, ...] | None:
        m = np.arange((t + 1) // 2, min(l, t - 1) + 1)
        n = t - m
        ok = avail[m] & avail[n] & np.where(m == n, two[m], True)
        if not ok.any():
            return None
        m = m[ok]
        i = len(m) - 1 - int(np.argmax(h[m][::-1]))  # most plentiful m; ties: the largest
        return (l, int(m[i]), int(t - m[i]))

    for slack in range(min(8, r)):  # fast path: a nearly exact fit exists
        t = r - slack
        if K >= 3 and t >= 2 and (shape := triple(t)) is not None:
            return shape
        if t <= l and avail[t]:
            return (l, t)
    # general case: the largest reachable pair sum, from a convolution of the availability
    singles = np.flatnonzero(avail[:min(r, l) + 1])
    t2 = int(singles[-1]) if len(singles) else 0
    t3 = 0
    if K >= 3 and r >= 2:
        a = avail.astype(np.int64)
        sums = np.convolve(a, a)[:r + 1]
        half = np.arange(r // 2 + 1)
        sums[2 * half] -= avail[half] & ~two[half]  # (x, x) needs two of x
        reach = np.flatnonzero(sums > 0)
        t3 = int(reach[-1]) if len(reach) else 0
    if t3 and t3 >= t2:
        return triple(t3)
    if t2:
        return (l, t2)
    return (l,)


# ---- streaming assignment ------------------------------------------------------------------------

@dataclass
class Rows:
    """Rows in CSR form: row i holds sequences refs[offsets[i]:offsets[i+1]] of those lengths."""

    sizes: np.ndarray
    refs: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def offsets(self) -> np.ndarray:
        return offsets_from_lengths(self.sizes)

    @property
    def row_lengths(self) -> np.ndarray:
        return np.add.reduceat(self.lengths, self.offsets[:-1]) if len(self.sizes) else \
            np.zeros(0, dtype=np.int64)

    @staticmethod
    def empty() -> Rows:
        z = np.zeros(0, dtype=np.int64)
        return Rows(z, z.copy(), z.copy())

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        parts = [p for p in parts if len(p)]
        if not parts:
            return Rows.empty()
        return Rows(*(np.concatenate([getattr(p, k) for p in parts])
                      for k in ("sizes", "refs", "lengths")))


@dataclass
class PackerStats:
    rows: int = 0
    sequences: int = 0
    tokens: int = 0
    peak_pending: int = 0  # sequences held for incomplete rows, at most
    flushes: int = 0  # times the pending cap was hit (its incomplete rows' sequences -> overflow)
    overflow: int = 0  # sequences packed by an overflow plan (0 for input matching the histogram)

    def efficiency(self, max_seq_length: int) -> float:
        return self.tokens / (self.rows * max_seq_length) if self.rows else 1.0


class _Slots:
    """A plan's slots (shape s, place p), with slots of each length listed in (shape, place) order."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        sizes = plan.sizes
        self.sizes = sizes
        self.first = offsets_from_lengths(sizes)[:-1]  # first slot of each shape
        self.shape = np.repeat(np.arange(len(sizes)), sizes)
        self.place = ranges(np.zeros_like(sizes), sizes)
        self.length = plan.shapes[self.shape, self.place]
        order = np.lexsort((self.place, self.shape, self.length))
        self.by_length = order
        self.length_start = np.searchsorted(self.length[order], np.arange(plan.max_seq_length + 2))
        # the first slot of each length in each shape: where a new row starts when l opens it
        opener = (self.place == 0) | (self.length != np.roll(self.length, 1))
        self.by_len = []  # per length: its slots, their shapes, its openers, their shapes
        for l in range(plan.max_seq_length + 1):
            slots = order[self.length_start[l]:self.length_start[l + 1]]
            openers = slots[opener[slots]]
            self.by_len.append((slots, self.shape[slots], openers, self.shape[openers]))

    def of_length(self, l: int) -> np.ndarray:
        return self.by_length[self.length_start[l]:self.length_start[l + 1]]

    def rows_from_entries(self, slot: np.ndarray, row: np.ndarray, ref: np.ndarray) -> Rows:
        """Group entries (slot, row number within its shape, ref) into rows, places in order."""
        if not len(slot):
            return Rows.empty()
        shape = self.shape[slot]
        order = np.lexsort((self.place[slot], row, shape))
        shape, row = shape[order], row[order]
        new = np.ones(len(order), dtype=bool)
        new[1:] = (shape[1:] != shape[:-1]) | (row[1:] != row[:-1])
        starts = np.flatnonzero(new)
        sizes = np.diff(np.append(starts, len(order)))
        return Rows(sizes.astype(np.int64), ref[order].astype(np.int64),
                    self.length[slot[order]].astype(np.int64))


def assign_present(lengths: np.ndarray, refs: np.ndarray, plan: Plan) -> Rows:
    """Rows for sequences all at hand (`plan` must cover exactly their histogram)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    refs = np.asarray(refs, dtype=np.int64)
    if not len(lengths):
        return Rows.empty()
    slots = _Slots(plan)
    order = np.argsort(lengths, kind="stable")
    first_of_length = np.searchsorted(lengths[order], np.arange(plan.max_seq_length + 1))
    s = slots.by_length  # slots grouped by length; each needs counts[shape] sequences
    need = plan.counts[slots.shape[s]]
    lens = slots.length[s]
    cum = np.cumsum(need) - need
    group_start = cum[slots.length_start[lens]] if len(s) else cum
    start = first_of_length[lens] + cum - group_start
    idx = ranges(start, need)
    return slots.rows_from_entries(np.repeat(s, need), ranges(np.zeros_like(need), need),
                                   refs[order[idx]])


class Packer:
    """Assign a stream of sequence lengths to the rows of `plan` (see the module docstring).

    push(lengths[, refs]) returns the rows completed so far (in completion order, grouped by
    shape); finish() returns the rest. refs default to the running index of each sequence.
    """

    def __init__(self, plan: Plan, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.plan = plan
        self.max_seq_length = plan.max_seq_length
        self.max_pending = int(max_pending)
        self._slots = _Slots(plan)
        self._quota = plan.counts.copy()  # rows of each shape not yet opened
        self._opened = np.zeros(len(plan.counts), dtype=np.int64)
        self._filled = np.zeros(len(self._slots.shape), dtype=np.int64)
        z = np.zeros(0, dtype=np.int64)
        self._pending = (z, z.copy(), z.copy())  # (slot, row within shape, ref)
        self._overflow: list[tuple[np.ndarray, np.ndarray]] = []  # (lengths, refs)
        self._overflow_size = 0
        self._next_ref = 0
        self.stats = PackerStats()

    @property
    def pending(self) -> int:
        return len(self._pending[0])

    def push(self, lengths: np.ndarray, refs: np.ndarray | None = None) -> Rows:
        lengths = np.asarray(lengths, dtype=np.int64)
        n = len(lengths)
        if refs is None:
            refs = np.arange(self._next_ref, self._next_ref + n, dtype=np.int64)
        refs = np.asarray(refs, dtype=np.int64)
        if len(refs) != n:
            raise ValueError("lengths and refs differ in size")
        self._next_ref += n
        if n and (lengths.min() < 1 or lengths.max() > self.max_seq_length):
            raise ValueError(f"sequence length outside 1..{self.max_seq_length}")
        order = np.argsort(lengths, kind="stable")
        sorted_refs = refs[order]
        bounds = np.searchsorted(lengths[order], np.arange(self.max_seq_length + 2))
        new: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for l in np.flatnonzero(np.diff(bounds)):
            self._place(int(l), sorted_refs[bounds[l]:bounds[l + 1]], new)
        out = [self._collect(new)]
        if self.pending > self.max_pending:
            self._flush()
        if self._overflow_size > self.max_pending:
            out.append(self._pack_overflow())
        return self._count(Rows.concat(out))

    def finish(self) -> Rows:
        """The remaining rows: the sequences of incomplete rows (there are none when the stream
        matched the plan's histogram and the cap was not hit) and the overflow, packed together
        with their own plan."""
        if self.pending:
            self._flush()
            self.stats.flushes -= 1  # the end of the stream is not a flush for lack of memory
        return self._count(self._pack_overflow())

    # -- internals

    def _count(self, rows: Rows) -> Rows:
        self.stats.rows += len(rows)
        self.stats.sequences += len(rows.refs)
        self.stats.tokens += int(rows.lengths.sum())
        return rows

    def _place(self, l: int, refs: np.ndarray, new: list) -> None:
        slots_l, shapes_l, openers, opener_shapes = self._slots.by_len[l]
        pos, n = 0, len(refs)
        while pos < n:
            if len(slots_l):  # rows waiting for an l: the most-waited-for slots first
                deficit = self._opened[shapes_l] - self._filled[slots_l]
                waiting = np.flatnonzero(deficit > 0)
                if len(waiting):
                    if len(waiting) > 1:
                        waiting = waiting[np.argsort(-deficit[waiting], kind="stable")]
                    s, d = slots_l[waiting], deficit[waiting]
                    ends = np.cumsum(d)
                    take = np.clip((n - pos) - (ends - d), 0, d)
                    total = min(int(ends[-1]), n - pos)
                    new.append((np.repeat(s, take), _ranges(self._filled[s], take, total),
                                refs[pos:pos + total]))
                    self._filled[s] += take
                    pos += total
                    if pos == n:
                        break
            quota = self._quota[opener_shapes]
            total_quota = int(quota.sum())
            if total_quota == 0:  # more l's than the plan has places for
                self._to_overflow(np.full(n - pos, l, dtype=np.int64), refs[pos:].copy())
                return
            r = min(n - pos, total_quota)
            x = _proportional(r, quota, total_quota)
            some = np.flatnonzero(x)
            s, x, shapes = openers[some], x[some], opener_shapes[some]
            new.append((np.repeat(s, x), _ranges(self._opened[shapes], x, r), refs[pos:pos + r]))
            self._opened[shapes] += x
            self._quota[shapes] -= x
            self._filled[s] += x
            pos += r

    def _collect(self, new: list) -> Rows:
        slot, row, ref = (np.concatenate([p[k] for p in new] + [self._pending[k]])
                          for k in range(3))
        if not len(slot):
            return Rows.empty()
        complete = np.minimum.reduceat(self._filled, self._slots.first)
        done = row < complete[self._slots.shape[slot]]
        self._pending = (slot[~done], row[~done], ref[~done])
        self.stats.peak_pending = max(self.stats.peak_pending, self.pending)
        return self._slots.rows_from_entries(slot[done], row[done], ref[done])

    def _flush(self) -> None:
        """Give up on the incomplete rows: their sequences join the overflow."""
        slot, _, ref = self._pending
        self._to_overflow(self._slots.length[slot], ref)
        self.stats.flushes += 1
        self._filled = self._opened[self._slots.shape].copy()  # nobody waits any more
        z = np.zeros(0, dtype=np.int64)
        self._pending = (z, z.copy(), z.copy())

    def _to_overflow(self, lengths: np.ndarray, refs: np.ndarray) -> None:
        self._overflow.append((lengths, refs))
        self._overflow_size += len(refs)
        self.stats.overflow += len(refs)

    def _pack_overflow(self) -> Rows:
        if not self._overflow:
            return Rows.empty()
        lengths = np.concatenate([p[0] for p in self._overflow])
        refs = np.concatenate([p[1] for p in self._overflow])
        self._overflow, self._overflow_size = [], 0
        plan = plan_packing(histogram(lengths, self.max_seq_length), self.plan.max_seqs_per_row,
                            self.max_seq_length)
        return assign_present(lengths, refs, plan)


def _ranges(starts: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
    """ranges(starts, counts) for small arrays whose counts sum to `total`."""
    if len(counts) == 1:
        return np.arange(starts[0], starts[0] + total, dtype=np.int64)
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total)


def _proportional(r: int, weights: np.ndarray, total: int) -> np.ndarray:
    """r (<= total = weights.sum()) split in proportion to weights, largest remainders first."""
    if len(weights) == 1:
        return np.array([r], dtype=np.int64)
    base = (r * weights) // total
    rem = r - int(base.sum())
    if rem:
        frac = r * weights - base * total
        base[np.argsort(-frac, kind="stable")[:rem]] += 1
    return base


def pack_lengths(chunks, max_seq_length: int, max_seqs_per_row: int = MAX_SEQS_PER_ROW,
                 max_pending: int = DEFAULT_MAX_PENDING, on_rows=None):
    """Pack a re-iterable stream of length chunks: pass 1 histogram, plan, pass 2 assignment.

    `chunks` is a callable returning a fresh iterator of int arrays each time (the stream is read
    twice). `on_rows(rows)` receives the rows as they complete. Returns (plan, packer.stats)."""
    hist = np.zeros(max_seq_length + 1, dtype=np.int64)
    for chunk in chunks():
        hist += histogram(chunk, max_seq_length)
    plan = plan_packing(hist, max_seqs_per_row, max_seq_length)
    packer = Packer(plan, max_pending)
    for chunk in chunks():
        rows = packer.push(chunk)
        if on_rows is not None and len(rows):
            on_rows(rows)
    rows = packer.finish()
    if on_rows is not None and len(rows):
        on_rows(rows)
    return plan, packer.stats
