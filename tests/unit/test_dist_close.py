"""Leaving the process group (bertperf.train.dist.Dist.close): a gloo group's worker threads are
among the threads the wait watches, and are idle once a collective is done; the wait lasts while
a watched thread is busy and ends when it sleeps, with the GIL free meanwhile (a busy worker that
needs the GIL gets it); a group of one rank is left and destroyed, so that a new one can be
made."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as tdist

from bertperf.train import dist
from bertperf.train.dist import Dist


def test_a_gloo_groups_workers_are_watched_and_idle_after_a_collective(tmp_path):
    before = set(dist.native_threads())
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                             world_size=1)
    try:
        tdist.all_reduce(torch.ones(4))
        assert len(set(dist.native_threads()) - before) >= 2  # gloo's two workers at least
        assert dist.threads_idle(dist.native_threads, timeout=5)
    finally:
        Dist(0, 1).close()
    assert not tdist.is_initialized()


def test_the_wait_lasts_while_a_thread_is_busy_and_gives_it_the_gil():
    counted = []

    def busy():  # Python bytecode: it runs only while it holds the GIL
        end = time.monotonic() + 0.4
        n = 0
        while time.monotonic() < end:
            n += 1
        counted.append(n)

    worker = threading.Thread(target=busy, daemon=True)
    start = time.monotonic()
    worker.start()
    assert not dist.threads_idle(lambda: [worker.native_id], timeout=0.1)
    assert dist.threads_idle(lambda: [worker.native_id], timeout=5)
    assert time.monotonic() - start >= 0.35 and counted and counted[0] > 0
    stop = threading.Event()
    sleeper = threading.Thread(target=stop.wait, daemon=True)
    sleeper.start()
    start = time.monotonic()
    assert dist.threads_idle(lambda: [sleeper.native_id], timeout=5)
    assert time.monotonic() - start < 1
    stop.set()
