"""`python -m bertperf bench comm`: GRAD_COMM's modes over a real slow link. Two network
namespaces of this machine, each one node, joined by one veth pair whose two ends are limited
with `tc qdisc ... tbf` (each end shapes what leaves it); one rank in each (torch's env
rendezvous, gloo over the pair), started with `ip netns exec` inside a UTS namespace named after
its node (local SGD groups ranks by host name). Needs root, iproute2 and tc.

The rate: the demo model's gradient takes as long to cross the link as BERT-large's takes on
10 Gb/s Ethernet: 335M parameters x 4 bytes = 1.34 GB = 10.7 Gbit, 1.07 s at 10 Gb/s (a ring
all-reduce sends 2(W-1)/W of it per rank: on 2 ranks all of it, each way at once); rate = the
demo model's gradient bytes / 1.07 s. First the link is measured (an all-reduce of that many
bytes, its time against bytes / rate), then each mode trains the demo (its data and
config_CPU_1x2x32x1.sh: 2 ranks x 32, the tiny BERT, target 0.13) to its target across it: step
time (the run's time outside evals / steps), bytes a rank sent a step (the trainer's count, the
grad_comm_bytes event), samples and wall time (run_start to run_stop) to the target."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bertperf import reaper
from bertperf.config import GRAD_COMMS as MODES
from bertperf.errors import UserError
from bertperf.formats.outputs import claim, mark
from bertperf.host import cpu_name

BERT_LARGE_PARAMS = 335_000_000
ETHERNET_BITS = 10e9
LARGE_SECONDS = BERT_LARGE_PARAMS * 4 * 8 / ETHERNET_BITS
"""1.072 s: BERT-large's fp32 gradient over 10 Gb/s."""

ALLREDUCE_SCRIPT = """
import os, sys, time, torch, torch.distributed as d
d.init_process_group("gloo", init_method="env://")
t = torch.ones(int(sys.argv[1]) // 4)
d.all_reduce(t); d.barrier()
times = []
for _ in range(int(sys.argv[2])):
    s = time.perf_counter(); d.all_reduce(t); times.append(time.perf_counter() - s)
if d.get_rank() == 0:
    print(" ".join(f"{x:.4f}" for x in times))
from bertperf.train.dist import Dist
Dist(d.get_rank(), d.get_world_size()).close()
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default="allreduce,bf16,powersgd,localsgd",
                   help=f"GRAD_COMM modes, comma-separated (of {', '.join(MODES)}; default "
                        "allreduce,bf16,powersgd,localsgd)")
    p.add_argument("--demo", default="out/demo", help="the demo's data (make demo)")
    p.add_argument("--config", default="config_CPU_1x2x32x1.sh", help="the demo's config file")
    p.add_argument("--rate-mbit", type=float, default=None,
                   help="the link's rate in Mbit/s (default: the scaling of the docstring)")
    p.add_argument("--powersgd-rank", type=int, default=4, help="POWERSGD_RANK (default 4)")
    p.add_argument("--localsgd-period", type=int, default=8, help="LOCALSGD_PERIOD (default 8)")
    p.add_argument("--out", default=None, help="folder for the runs' logs (default: a temp one)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds a run may take")


def demo_gradient_bytes(bert_config: str = "tiny") -> int:
    import torch

    from bertperf.model import BertForPreTraining
    from bertperf.model.bert_config import BertConfig
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig.named(bert_config))
    return sum(p.numel() * 4 for p in model.parameters())


def _run(*cmd: str) -> None:
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if r.returncode:
        raise UserError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")


TAG = "BENCH_COMM_LINK"
"""The variable every rank started on a link carries (its namespaces' prefix)."""


class SlowLink:
    """Two namespaces <prefix>n1/n2 joined by a veth pair (eth0 in each, 10.232.<x>.1 and .2,
    names n1 and n2 in /etc/netns/<ns>/hosts), both ends limited to `rate_bits` with tbf.
    A context manager: on exit, SIGTERM's included (it unwinds as SystemExit while the link
    exists), the ranks started on it are killed and everything is removed."""

    def __init__(self, rate_bits: float) -> None:
        self.rate_bits = rate_bits
        self.prefix = f"bc{os.getpid() % 100000}"
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        third = next(t for t in range(64, 256) if f" 10.232.{t}." not in used)
        self.addresses = [f"10.232.{third}.1", f"10.232.{third}.2"]
        self.made: list[list[str]] = []

    def namespace(self, node: int) -> str:
        return f"{self.prefix}n{node}"

    def __enter__(self) -> SlowLink:
        self.sigterm = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        try:
            hosts = "127.0.0.1 localhost\n" + "".join(
                f"{a} n{k}\n" for k, a in enumerate(self.addresses, 1))
            for k in (1, 2):
                _run("ip", "netns", "add", self.namespace(k))
                self.made.append(["ip", "netns", "del", self.namespace(k)])
                folder = Path("/etc/netns") / self.namespace(k)
                folder.mkdir(parents=True, exist_ok=True)
                self.made.append(["rm", str(folder)])
                (folder / "hosts").write_text(hosts)
            _run("ip", "link", "add", f"{self.prefix}a", "netns", self.namespace(1), "type",
                 "veth", "peer", "name", f"{self.prefix}b", "netns", self.namespace(2))
            # a burst of 1 ms at the rate (at least 2 full frames), a queue of 100 ms
            burst = max(int(self.rate_bits / 8 / 1000), 3200)
            for k, veth in ((1, f"{self.prefix}a"), (2, f"{self.prefix}b")):
                ns = ["ip", "netns", "exec", self.namespace(k)]
                _run(*ns, "ip", "link", "set", veth, "name", "eth0")
                _run(*ns, "ip", "addr", "add", f"{self.addresses[k - 1]}/24", "dev", "eth0")
                _run(*ns, "ip", "link", "set", "eth0", "up")
                _run(*ns, "ip", "link", "set", "lo", "up")
                _run(*ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                     f"{int(self.rate_bits)}bit", "burst", str(burst), "latency", "100ms")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        reaper.reap(TAG, self.prefix, grace=0)
        signal.signal(signal.SIGTERM, self.sigterm)
        for undo in reversed(self.made):
            if undo[0] == "rm":
                shutil.rmtree(undo[1], ignore_errors=True)
            else:
                subprocess.run(undo, capture_output=True)
        self.made.clear()

    def command(self, node: int, argv: list[str]) -> list[str]:
        """`argv` run on node `node` (1 or 2): in its namespace, its host name n<node>."""
        inner = " ".join(shlex.quote(a) for a in argv)
        return ["ip", "netns", "exec", self.namespace(node), "unshare", "--uts", "sh", "-c",
                f"hostname n{node}; exec {inner}"]

    def start(self, argv: list[str], env: dict[str, str], out: Path,
              port: int = 29511) -> list[subprocess.Popen]:
        """Rank k-1 of `argv` on node k (1, 2), rank 0's address the rendezvous; their output in
        out/rank<k>.txt."""
        procs = []
        for k in (1, 2):
            renv = {**env, "RANK": str(k - 1), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                    "MASTER_ADDR": self.addresses[0], "MASTER_PORT": str(port),
                    "GLOO_SOCKET_IFNAME": "eth0", TAG: self.prefix}
            with open(out / f"rank{k}.txt", "w") as f:
                procs.append(subprocess.Popen(self.command(k, argv), env=renv, stdout=f,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True))
        return procs

    def allreduce_seconds(self, nbytes: int, repeats: int, out: Path) -> list[float]:
        """The times of `repeats` gloo all-reduces of `nbytes` bytes between the two nodes."""
        script = out / "allreduce.py"
        script.write_text(ALLREDUCE_SCRIPT)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = self.start([sys.executable, str(script), str(nbytes), str(repeats)], env, out,
                           port=29510)
        wait(procs, 300)
        return [float(x) for x in (out / "rank1.txt").read_text().split()[-repeats:]]


def wait(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, 9)
            raise UserError(f"a run took over {timeout:.0f} s; stopped") from None
    return codes


def config_env(config: Path) -> dict[str, str]:
    """The variables the demo's config file exports."""
    r = subprocess.run(["bash", "-c", f"set -a; source {shlex.quote(str(config))}; env -0"],
                       capture_output=True, text=True, check=True)
    return dict(item.split("=", 1) for item in r.stdout.split("\0") if "=" in item)


def read_log(path: Path) -> dict:
    """What a run's MLPerf log says: status, train_samples, run time, eval time, bytes."""
    ev = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()
          if ":::MLLOG " in line]
    at = {e["key"]: e for e in ev}
    evals = [(s["time_ms"], e["time_ms"]) for s, e in zip(
        [e for e in ev if e["key"] == "eval_start"], [e for e in ev if e["key"] == "eval_stop"])]
    wall = (at["run_stop"]["time_ms"] - at["run_start"]["time_ms"]) / 1000
    return {"status": at["run_stop"]["metadata"]["status"], "samples": at["train_samples"]["value"],
            "wall": wall, "train": wall - sum(b - a for a, b in evals) / 1000,
            "bytes": at["grad_comm_bytes"]["value"],
            "accuracy": [round(e["value"], 4) for e in ev if e["key"] == "eval_accuracy"],
            "gbs": at["global_batch_size"]["value"]}


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise UserError("bench comm makes network namespaces and tc qdiscs: it needs root")
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            raise UserError(f"bench comm needs {tool} (iproute2, util-linux), not found")
    demo, config = Path(args.demo).resolve(), Path(args.config).resolve()
    if not (demo / "unpadded").is_dir() or not config.is_file():
        raise UserError(f"{demo}/unpadded or {config} missing (make demo prepares the data)")
    if args.out is not None:
        claim("--out", args.out, "bench comm", inputs=[("--demo", demo), ("--config", config)])
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise UserError(f"--modes: of {', '.join(MODES)}, not {args.modes!r}")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_comm_")).resolve()
    mark(out, "bench comm")
    nbytes = demo_gradient_bytes()
    rate = args.rate_mbit * 1e6 if args.rate_mbit else nbytes * 8 / LARGE_SECONDS
    print(f"{cpu_name()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          f"\ndemo gradient {nbytes:,} bytes; BERT-large's over 10 Gb/s: {LARGE_SECONDS:.3f} s; "
          f"link {rate / 1e6:.1f} Mbit/s (tbf, both ends); logs in {out}", flush=True)
    env = {**os.environ, **config_env(config), "DATADIR_PHASE2": str(demo / "unpadded"),
           "EVAL_FILE": str(demo / "hdf5" / "eval" / "eval_10k.hdf5"), "SEED": "1",
           "POWERSGD_RANK": str(args.powersgd_rank),
           "LOCALSGD_PERIOD": str(args.localsgd_period), "DIST_TIMEOUT": "600"}
    rows = []
    with SlowLink(rate) as link:
        times = link.allreduce_seconds(nbytes, 3, out)
        expected = nbytes * 8 / rate
        print(f"all-reduce of {nbytes:,} bytes: {min(times):.3f} s best of {times} "
              f"(bytes / rate = {expected:.3f} s)", flush=True)
        print(f"\n{'mode':<14}{'step s':>8}{'MiB/step':>10}{'samples':>9}{'wall s':>8}"
              f"{'status':>9}  accuracies", flush=True)
        for mode in modes:
            folder = out / mode
            folder.mkdir(exist_ok=True)
            log = folder / "result.txt"
            procs = link.start([sys.executable, "-m", "bertperf", "train"],
                               {**env, "GRAD_COMM": mode, "MLLOG_FILE": str(log),
                                "LOGDIR": str(folder)}, folder)
            codes = wait(procs, args.timeout)
            if any(codes):
                tail = (folder / "rank1.txt").read_text()[-1500:]
                raise UserError(f"GRAD_COMM={mode}: a rank exited {codes}: {tail}")
            r = read_log(log)
            r["step"] = r["train"] / (r["samples"] / r["gbs"])
            rows.append((mode, r))
            print(f"{mode:<14}{r['step']:>8.3f}{r['bytes'] / 2**20:>10.3f}{r['samples']:>9}"
                  f"{r['wall']:>8.1f}{r['status']:>9}  {r['accuracy']}", flush=True)
    base = dict(rows).get("allreduce")
    if base is not None:
        print("\nagainst allreduce: " + "; ".join(
            f"{m} wall {r['wall'] / base['wall']:.2f}x, "
            f"samples {r['samples'] / base['samples']:.2f}x"
            for m, r in rows if m != "allreduce"))
    return 0
