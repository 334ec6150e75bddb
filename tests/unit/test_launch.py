"""`python -m bertperf launch`: which rank's failure its last line names, and what the ranks tell
it through their error files (torch's ProcessFailure and ErrorHandler, no processes started)."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys

import pytest

from bertperf.errors import UserError
from bertperf.train.dist import FollowOnError
from bertperf.train import launch
from bertperf.train.launch import failure_line, reported_to_launcher

ERROR_FILES = itertools.count()


def failure(tmp_path, monkeypatch, local_rank: int, exitcode: int,
            error: Exception | None = None):
    """torch's record of a rank that ended with `exitcode`, after raising `error` (written to
    its error file as the launcher's ranks do) or without a word (killed, or no error file)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    error_file = tmp_path / f"error_{next(ERROR_FILES)}.json"
    if error is not None:
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
        with pytest.raises(type(error)), reported_to_launcher(under_launcher=False):
            raise error
        monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    return ProcessFailure(local_rank=local_rank, pid=1000 + local_rank, exitcode=exitcode,
                          error_file=str(error_file))


def test_a_killed_rank_is_named_with_its_signal(tmp_path, monkeypatch):
    """Rank 0 saw the broken collective, then got the launcher's SIGTERM: rank 1's SIGKILL is
    the cause, whatever order the launcher noticed them in."""
    survivor = failure(tmp_path, monkeypatch, 0, 1,
                       FollowOnError("rank 0: a collective failed (Connection closed by peer); "
                                     "did another rank die?"))
    killed = failure(tmp_path, monkeypatch, 1, -signal.SIGKILL)
    assert failure_line({0: survivor, 1: killed}) == \
        "rank 1 (local rank 1, pid 1001) died: SIGKILL"
    stopped = failure(tmp_path, monkeypatch, 0, -signal.SIGTERM)
    assert failure_line({0: stopped, 1: killed}) == \
        "rank 1 (local rank 1, pid 1001) died: SIGKILL"


def test_a_rank_error_is_quoted(tmp_path, monkeypatch):
    own = failure(tmp_path, monkeypatch, 1, 1, UserError("rank 1: part_1.h5: md5 mismatch"))
    follow = failure(tmp_path, monkeypatch, 0, 1, FollowOnError("rank 0: stopped by SIGTERM"))
    assert failure_line({0: follow, 1: own}) == \
        "rank 1 (local rank 1, pid 1001) exited with status 1: rank 1: part_1.h5: md5 mismatch"
    silent = failure(tmp_path, monkeypatch, 0, 2)
    assert failure_line({0: silent}) == "rank 0 (local rank 0, pid 1000) exited with status 2"


def test_the_launcher_stopping_the_rank_at_fault_does_not_hide_it(tmp_path, monkeypatch):
    """Both ranks fail the data check together: rank 0's FollowOnError, while rank 1, with its
    own error, gets the launcher's SIGTERM (said, or before it could say anything): rank 1."""
    follow = failure(tmp_path, monkeypatch, 0, 1,
                     FollowOnError("rank 0: data check failed on another rank (see its error)"))
    said = failure(tmp_path, monkeypatch, 1, -signal.SIGTERM,
                   UserError("rank 1: part_1.h5: md5 mismatch"))
    assert failure_line({0: follow, 1: said}) == ("rank 1 (local rank 1, pid 1001) failed: rank 1: "
                                                  "part_1.h5: md5 mismatch (then SIGTERM)")
    unsaid = failure(tmp_path, monkeypatch, 1, -signal.SIGTERM)
    assert failure_line({0: follow, 1: unsaid}) == "rank 1 (local rank 1, pid 1001) died: SIGTERM"


def test_a_follower_waits_under_a_launcher(monkeypatch):
    waits = []
    monkeypatch.setattr(launch.time, "sleep", waits.append)
    for under, error in itertools.product((False, True), (UserError("x"), FollowOnError("y"))):
        with pytest.raises(type(error)), reported_to_launcher(under_launcher=under):
            raise error
    assert waits == [launch.FOLLOWER_GRACE_S]


def test_outside_a_launcher_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError), reported_to_launcher(under_launcher=False):
        raise UserError("x")
    assert list(tmp_path.iterdir()) == []


def test_launch_help_starts_without_torch():
    code = ("import sys\nfrom bertperf.__main__ import build_parser\n"
            "argv = ['launch', '--help']\n"
            "try:\n    build_parser(argv).parse_args(argv)\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_sigterm_swallowed_where_it_landed_stops_the_next_step():
    """SIGTERM raises wherever the main thread is; where that raise is swallowed (a finalizer, a
    library's broad except clause) the loop's step boundary raises it again, and leaving the
    block puts the earlier handler back and forgets the signal."""
    import os

    from bertperf.train.dist import failures_as_errors, raise_if_terminated
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(FollowOnError, match="rank 3: stopped by SIGTERM"):
        with failures_as_errors(3):
            raise_if_terminated()  # no signal yet: nothing to raise
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # the handler runs between bytecodes of this thread
                    pass
            except Exception:  # noqa: BLE001 (what a library might do with it)
                pass
            raise_if_terminated()
    assert signal.getsignal(signal.SIGTERM) is before
    with failures_as_errors(3):
        raise_if_terminated()


def test_a_failed_collective_names_the_ranks_no_longer_heard_from():
    """The heartbeat store names silent ranks and their host when a collective fails; a rank
    that cannot reach the store says so; with every rank alive the old wording stays."""
    import time

    import torch.distributed as tdist

    from bertperf.train import dist

    class Store:  # the TCPStore calls the heartbeat makes
        def __init__(self):
            self.data, self.up = {}, True

        def set(self, key, value):
            self.data[key] = value.encode()

        def get(self, key):
            if not self.up:
                raise RuntimeError("connection refused")
            return self.data[key]

        def set_timeout(self, timeout):
            pass

    store, beat = Store(), dist._heartbeat
    try:
        beat.start(0, 4, every=0.05, store=store)
        now = time.time()
        for r, host in [(1, "n1"), (2, "n2"), (3, "n2")]:
            store.set(f"bertperf/alive/{r}", f"{now - (9 if host == 'n2' else 0)} {host}")
        with pytest.raises(dist.FollowOnError) as err:
            with dist.failures_as_errors(0):
                raise tdist.DistBackendError("Timed out waiting 10000ms for recv operation")
        assert str(err.value).startswith("rank 0: a collective failed (Timed out waiting")
        assert str(err.value).endswith("ranks 2, 3 (on n2) silent for 9 s: lost")
        store.up = False
        assert beat.silent() == ("the rendezvous store cannot be reached either: this rank lost "
                                 "the others")
        store.up = True
        for r in range(4):
            store.set(f"bertperf/alive/{r}", f"{time.time()} n1")
        assert beat.silent() == ""
    finally:
        beat.stop.set()
        beat.world_size = 0
