"""Per-rank training batches: the epoch order of data/order.py over a data/dataset.py training set,
collated and built ahead on a background thread (`prefetch`; the batches are the same without
it), resumable at any sample (`position`: samples of the epoch this rank has consumed; state_dict
/ load_state_dict). Unpadded shards' samples go through `collate` (collate_varlen by default),
packed shards' rows through collate_packed (at most `masks_per_row` masked tokens a row, checked
on every row). Every batch carries `global_sequences`, the sequences of the whole global batch,
so a trainer counts MLPerf's samples without a collective. With `balance` every global batch is
placed on the ranks by data/balance.py; stratified datasets follow StratifiedPlan."""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Callable, Iterable, Iterator

import numpy as np

from bertperf.data.balance import place
from bertperf.data.collate import collate_packed, collate_varlen, rows_over
from bertperf.data.dataset import ShardDataset
from bertperf.data.order import SPLITS, EpochPlan, StratifiedPlan
from bertperf.errors import UserError
from bertperf.formats.samples import Samples

STATE_FORMAT = "bertperf-loader-state/1"
Plan = EpochPlan | StratifiedPlan
_DONE = object()


@contextlib.contextmanager
def prefetched(items: Iterable, depth: int) -> Iterator[Iterator]:
    """`items` consumed `depth` ahead on a background thread (a bounded queue); the items and their
    order are unchanged, an exception in the producer is raised in the consumer, and leaving the
    block stops the thread (and waits for it, unless the block is left on that thread: an
    abandoned block is finalised by the garbage collector on whichever thread it runs). depth
    0: `items` itself, on the caller's thread."""
    if depth <= 0:
        yield iter(items)
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)

    def consume() -> Iterator:
        while (item := q.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item

    thread = threading.Thread(target=produce, name="bertperf-loader", daemon=True)
    thread.start()
    try:
        yield consume()
    finally:
        stop.set()
        if thread is not threading.current_thread():  # the collector may finalise it there
            thread.join()


class ShardLoader:
    """Batches of rank `rank`'s samples, one epoch per `for` loop (module docstring for the order).

    Iterating yields the rest of the current epoch from `position`, then moves to (epoch + 1, 0).
    `prefetch` > 0 builds that many batches ahead on a background thread (bounded queue); the
    batches are the same with or without it.
    """

    def __init__(self, dataset: ShardDataset, batch_size: int, *, rank: int = 0,
                 world_size: int = 1, seed: int = 0, epoch: int = 0, start_sample: int = 0,
                 collate: Callable[[Samples], dict] | None = None, drop_last: bool = True,
                 prefetch: int = 2,
                 max_seq_length: int | None = None, max_pred: int | None = None,
                 split: str = "shards", masks_per_row: int | None = None,
                 balance: bool = False) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if collate is not None and dataset.packed:
            raise ValueError("packed shards' rows are collated by collate_packed, not `collate`")
        if seed < 0 or epoch < 0 or start_sample < 0:
            raise ValueError("seed, epoch and start_sample must be non-negative")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        if dataset.bins is not None and split != "global_batch":
            raise ValueError("stratified data is read with split global_batch")
        self.split, self.balance = split, balance and world_size > 1
        self.dataset, self.batch_size = dataset, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.collate = collate or collate_varlen
        self.drop_last, self.prefetch = drop_last, max(0, prefetch)
        self.max_seq_length = max_seq_length or dataset.max_seq_length
        self.max_pred = max_pred or dataset.max_pred
        room = (dataset.max_seqs_per_row or 1) * self.max_pred  # Packed.batch's columns
        self.masks_per_row = min(masks_per_row or room, room)
        self.epoch, self.position = epoch, start_sample
        self._plan: Plan | None = None
        self._placements: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    # -- order --
    def plan(self, epoch: int | None = None) -> Plan:
        epoch = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = self.new_plan(epoch)
        return self._plan

    def new_plan(self, epoch: int) -> Plan:
        if self.dataset.bins is not None:
            return StratifiedPlan(self.dataset.bin_counts(), self.seed, epoch, self.rank,
                                  self.world_size, block=self.batch_size)
        return EpochPlan(self.dataset.counts, self.seed, epoch, self.rank, self.world_size,
                         split=self.split, block=self.batch_size)

    @property
    def samples_per_epoch(self) -> int:
        return self.plan().length

    def refs(self, plan: Plan, start: int, stop: int,
             rank: int | None = None) -> list[tuple[int, np.ndarray]]:
        """This rank's (or rank `rank`'s) samples at positions start..stop-1 as (shard, rows)
        runs: the plan's, or with `balance` the ones data/balance.py places on the rank from
        each global batch (every rank's samples at the same positions), in stream order."""
        if not self.balance:
            return plan.refs(start, stop, rank)
        b, r = self.batch_size, self.rank if rank is None else rank
        full, out, p = plan.length // b, [], start
        while p < min(stop, plan.length):
            k0 = p // b * b
            shards, rows = self.placement(plan, k0, b if k0 < full * b else plan.length - k0)
            a, z = p - k0, min(stop - k0, shards.shape[1])
            s, x = shards[r, a:z], rows[r, a:z]
            cut = np.flatnonzero(np.diff(s)) + 1
            out += [(int(run[0]), rr) for run, rr in zip(np.split(s, cut), np.split(x, cut))]
            p = k0 + z
        return out

    def placement(self, plan: Plan, k0: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """[W, size] shard numbers and rows: what each rank reads of the global batch made of
        every rank's positions k0..k0+size-1 (data/balance.py place, each row in stream order);
        the last two are kept."""
        key = (plan.epoch, k0)
        if key not in self._placements:
            everyone = plan.everyone(k0, k0 + size)
            shards = np.concatenate([np.full(len(rows), s, dtype=np.int64)
                                     for s, rows in everyone])
            rows = np.concatenate([rows for _, rows in everyone])
            lengths = np.concatenate([self.dataset.lengths(s)[rows] for s, rows in everyone])
            where = np.sort(place(lengths, self.world_size), axis=1)
            self._placements[key] = shards[where], rows[where]
            while len(self._placements) > 2:
                del self._placements[next(iter(self._placements))]
        return self._placements[key]

    def __len__(self) -> int:
        """Batches in a whole epoch."""
        n = self.samples_per_epoch
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        self.epoch, self.position = epoch, position

    def batch_starts(self) -> range:
        length = self.samples_per_epoch
        end = length if not self.drop_last else \
            self.position + max(0, length - self.position) // self.batch_size * self.batch_size
        return range(self.position, end, self.batch_size)

    def samples(self, plan: Plan, start: int, stop: int) -> Samples:
        parts = [self.dataset.take(shard, rows) for shard, rows in self.refs(plan, start, stop)]
        return parts[0] if len(parts) == 1 else Samples.concat(parts)

    def make_batch(self, plan: Plan, start: int) -> dict[str, np.ndarray]:
        stop = start + self.batch_size
        if self.dataset.packed:
            parts = [self.packed_rows(shard, rows) for shard, rows in self.refs(plan, start, stop)]
            rows = parts[0] if len(parts) == 1 else \
                {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            everyone = [ref for r in range(self.world_size)
                        for ref in self.refs(plan, start, stop, r)]
            return {**collate_packed(rows, self.masks_per_row),
                    "global_sequences": np.int64(sum(self.sequences(*ref) for ref in everyone))}
        s = self.samples(plan, start, start + self.batch_size)
        # every rank's batch has as many samples as this one
        return {**self.collate(s), "global_sequences": np.int64(len(s) * self.world_size)}

    def packed_rows(self, shard: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Packed.batch of these rows of `shard`, each checked against masks_per_row."""
        reader = self.dataset.reader(shard)
        arrays = reader.batch(rows, self.max_seq_length, self.dataset.max_seqs_per_row,
                              self.max_pred)
        if over := rows_over(arrays, self.masks_per_row):
            raise UserError(f"{reader.path}: row {int(rows[over[0]])} holds {over[1]} masked "
                            f"tokens, more than the {self.masks_per_row} a packed batch has room "
                            "for (data masked at a higher rate than the trainer assumes?)")
        return arrays

    def sequences(self, shard: int, rows: np.ndarray) -> int:
        """Sequences in these rows of packed shard `shard` (read from its row index only)."""
        offsets = self.dataset.reader(shard).rows.row_seq_offsets
        return int((offsets[rows + 1] - offsets[rows]).sum())

    # -- iteration --
    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        epoch = self.epoch
        # the batches are built from a plan of their own (on the prefetch thread), so the caller
        # may inspect self.plan() meanwhile
        plan = self.new_plan(epoch)
        starts = self.batch_starts()
        batches = (self.make_batch(plan, start) for start in starts)
        with prefetched(batches, self.prefetch) as ahead:
            for start, batch in zip(starts, ahead):
                self.position = min(start + self.batch_size, plan.length)
                yield batch
        if self.epoch == epoch:
            self.epoch, self.position = epoch + 1, 0

    # -- resume --
    def state_dict(self) -> dict:
        return {"format": STATE_FORMAT, "seed": self.seed, "epoch": self.epoch,
                "position": self.position, "rank": self.rank, "world_size": self.world_size,
                "split": self.split, "batch_size": self.batch_size, "balance": self.balance,
                "samples": self.dataset.num_samples, "fingerprint": self.dataset.fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        """Go on where `state` (state_dict()) left off: the same shards, seed, rank, world size,
        split and balance (and batch size for split global_batch or balance); or, with split
        global_batch and unstratified data, a state of another world size with the same global
        batch (its world_size x batch_size) saved at a batch boundary: the global batches are the
        same, so the run goes on from the same one."""
        if state.get("format") != STATE_FORMAT:
            raise UserError(f"loader state: unknown format {state.get('format')!r}")
        size = int(state.get("world_size") or 0) * int(state.get("batch_size") or 0)
        resized = (self.split == "global_batch" and self.dataset.bins is None
                   and state.get("split") == "global_batch"
                   and state.get("world_size") != self.world_size
                   and size == self.world_size * self.batch_size)
        checks = [("seed", self.seed), ("fingerprint", self.dataset.fingerprint()),
                  ("split", self.split)]  # states without "split" are "shards" states
        if not resized:
            checks += [("world_size", self.world_size), ("rank", self.rank),
                       ("balance", self.balance)]  # states without "balance": unbalanced
            if self.split == "global_batch" or self.balance:  # blocks of batch_size samples
                checks.append(("batch_size", self.batch_size))
        older = {"split": "shards", "balance": False}
        for key, mine in checks:
            got = state.get(key, older[key]) if key in older else state.get(key)
            if got != mine:
                raise UserError(f"loader state: {key} {got!r} differs from this loader's "
                                f"{mine!r}; exact resume needs the same shards, seed, rank, "
                                "world size, split and balance (and batch size for split "
                                "global_batch or balance), or for split global_batch the same "
                                "global batch")
        position = int(state["position"])
        if resized:
            old_b = int(state["batch_size"])
            if position % old_b:
                raise UserError(f"loader state: position {position} is inside a batch of "
                                f"{old_b}; resuming on {self.world_size} ranks instead of "
                                f"{state['world_size']} needs a batch boundary")
            position = position // old_b * self.batch_size
        self.epoch, self.position = int(state["epoch"]), position

    def close(self) -> None:
        self.dataset.close()
