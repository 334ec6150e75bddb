"""A real slow link (bertperf.bench.comm.SlowLink, what `bench comm` trains across): two network
namespaces joined by a veth pair limited with tc's tbf. An all-reduce between them takes
bytes / rate (the link limits it; gloo's headers and TCP's add a little), and the trainer runs
GRAD_COMM=bf16 across it on 2 ranks (the copy task), its log passing the compliance checker, the
link's counters showing at least the bytes the trainer says it sent. Root only (namespaces, tc)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ddp import data  # noqa: F401
from tests.support.mlperf_logs import checker, events
from tests.support.paths import PYTHONPATH
from tests.support.runs import base_env

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("ip") is None,
    reason="network namespaces and tc qdiscs need root, iproute2 and tc")

RATE = 40e6  # bits/s
NBYTES = 4_000_000


def sent_bytes(link, node: int) -> int:
    out = subprocess.run(["ip", "netns", "exec", link.namespace(node), "tc", "-s", "qdisc",
                          "show", "dev", "eth0"], capture_output=True, text=True).stdout
    return int(out.split("Sent ", 1)[1].split(" bytes", 1)[0])


def test_throttled_link_limits_the_rate_and_bf16_trains_across_it(data, tmp_path):  # noqa: F811
    from bertperf.bench.comm import SlowLink, wait
    with SlowLink(RATE) as link:
        seconds = min(link.allreduce_seconds(NBYTES, 2, tmp_path))
        expected = NBYTES * 8 / RATE  # 0.8 s: on 2 ranks each sends the whole tensor once
        print(f"all-reduce of {NBYTES} bytes at {RATE / 1e6:.0f} Mbit/s: {seconds:.3f} s, "
              f"bytes / rate {expected:.3f} s")
        assert expected * 0.9 < seconds < expected * 1.6
        before = sent_bytes(link, 1)
        out = tmp_path / "run"
        out.mkdir()
        env = {**base_env(data, out, 2), "PYTHONPATH": PYTHONPATH, "MAX_STEPS": "8",
               "GRAD_COMM": "bf16", "SUBMISSION_DIVISION": "open", "EVAL_ITER_SAMPLES": "64"}
        codes = wait(link.start([sys.executable, "-m", "bertperf", "train"], env, out), 240)
        assert codes == [0, 0], (out / "rank1.txt").read_text()[-3000:]
        log = out / "result_0.txt"
        assert "SUCCESS" in checker(log).stderr
        comm = next(e for e in events(log) if e["key"] == "grad_comm_bytes")
        assert comm["metadata"]["steps"] == 8 and comm["metadata"]["reduction"] == "bf16"
        # rank 0's end sent at least the payload the trainer counted (and the headers)
        assert sent_bytes(link, 1) - before >= comm["metadata"]["world_bytes"] / 2


STOPPED = """
import sys, time
from pathlib import Path
from bertperf.bench.comm import SlowLink
with SlowLink(1e6) as link:
    link.start([sys.executable, "-c", "import time; time.sleep(300)"], {}, Path(sys.argv[1]))
    print(link.prefix, flush=True)
    time.sleep(300)
"""


def test_sigterm_leaves_no_rank_and_no_namespace(tmp_path):
    """`bench comm` stopped by SIGTERM (as `timeout` stops it) while ranks train across the link:
    the ranks (each in a session of its own, in a namespace) are killed and the namespaces and
    their /etc/netns folders removed."""
    from bertperf import reaper
    from bertperf.bench.comm import TAG
    proc = subprocess.Popen([sys.executable, "-c", STOPPED, str(tmp_path)], text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": PYTHONPATH})
    prefix = proc.stdout.readline().strip()
    assert prefix, proc.communicate()
    deadline = time.monotonic() + 30
    while len(reaper.tagged(TAG, prefix)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(reaper.tagged(TAG, prefix)) >= 2  # both ranks run
    proc.terminate()
    assert proc.wait(timeout=60) == 143
    assert reaper.tagged(TAG, prefix) == []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in namespaces
    assert not any(p.name.startswith(prefix) for p in Path("/etc/netns").glob("*"))
