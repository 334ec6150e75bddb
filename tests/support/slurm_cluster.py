"""A real single-node Slurm cluster on localhost for end-to-end tests (Debian's slurm-wlm + munge).

`local_slurm_cluster()` starts a private munged, slurmctld and slurmd; every file (munge key and
socket, slurm.conf, state, spool, logs, pid files) lives in one fresh directory under /tmp, the
ports are free ones picked at start-up, and nothing system-wide (/etc/munge, /etc/slurm, /run) is
read or written. Client commands find the cluster through `cluster.env` (SLURM_CONF).

The daemons run under a small supervisor process (this file run as a script) that is a child
subreaper: slurmstepd and job processes that slurmd double-forks are re-parented to it instead of
to PID 1, so tear-down can end every one of them by id, and a pytest killed outright still takes
the cluster down with it (the supervisor stops everything when its stdin closes).

The session fixture `slurm_cluster` skips when Slurm is not installed or, for a non-root user,
cannot be started; as root with Slurm installed, a cluster that does not come up fails the test
with the daemons' logs.

SLURM_E2E_KEEP=1 keeps the cluster's directory (logs, slurm.conf, spool) after tear-down.

Apt packages (Debian bookworm, Slurm 22.05):
    apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

DAEMONS = ("munged", "munge", "slurmctld", "slurmd", "slurmstepd")
CLIENTS = ("sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")
INSTALL_HINT = ("Slurm not installed: run `make setup` as root "
                "(apt-get install slurm-wlm munge)")
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
START_TIMEOUT = 60.0


class SlurmStartError(RuntimeError):
    """The cluster did not come up; the message carries the daemons' logs."""


@dataclass
class JobResult:
    job_id: str
    state: str           # JobState, e.g. COMPLETED, FAILED, CANCELLED, TIMEOUT
    exit_code: int       # ExitCode=<code>:<signal> of the batch script
    signal: int
    fields: dict = field(repr=False, default_factory=dict)   # all of `scontrol show job -o`


def missing_binaries() -> list[str]:
    """Slurm/munge programs the cluster needs that are not on PATH (or in /usr/sbin)."""
    return [b for b in DAEMONS + CLIENTS if _which(b) is None]


def _which(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])
    return shutil.which(name, path=path)


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _mem_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 1024


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"--- {path.name}: (absent)"
    return f"--- {path.name} (last {min(lines, len(text))} lines):\n" + "\n".join(text[-lines:])


class SlurmCluster:
    """One controller + one node. Use `with local_slurm_cluster() as c:` or start()/stop()."""

    def __init__(self, parent: str | Path = "/tmp", cpus: int | None = None,
                 extra_conf: str = "") -> None:
        # munged wants every directory above its socket executable by all, and a unix socket path
        # is limited to 107 bytes: hence a short directory of our own, not pytest's tmp_path.
        self.parent = Path(parent)
        self.cpus = cpus or max(len(os.sched_getaffinity(0)), 4)
        self.extra_conf = extra_conf
        self.root: Path | None = None
        self.env: dict[str, str] = {}
        self.nodename = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname().split(".")[0]) or "node"
        self._sup: subprocess.Popen | None = None

    # ---------------------------------------------------------------- paths
    @property
    def conf(self) -> Path:
        assert self.root is not None
        return self.root / "slurm.conf"

    def logs(self, lines: int = 40) -> str:
        """The tails of the daemons' logs (*.out: their stderr, which alone has errors from
        before the log file is opened, e.g. a bad slurm.conf)."""
        if self.root is None:
            return ""
        names = {"munged.out": lines, "slurmctld.out": 10, "slurmctld.log": lines,
                 "slurmd.out": 10, "slurmd.log": lines, "supervisor.log": lines,
                 "exits.log": lines}
        return "\n".join(_tail(self.root / n, k) for n, k in names.items())

    # ---------------------------------------------------------------- start
    def start(self) -> "SlurmCluster":
        missing = missing_binaries()
        if missing:
            raise FileNotFoundError(f"{INSTALL_HINT}; missing: {' '.join(missing)}")
        self.root = Path(tempfile.mkdtemp(prefix="slurm-", dir=self.parent))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    # the parts a cluster of several nodes (netns_cluster.py) changes
    nodes = 1

    def controller(self) -> str:
        """slurm.conf's SlurmctldHost."""
        return f"{self.nodename}(127.0.0.1)"

    def node_names(self) -> list[str]:
        return [self.nodename]

    def node_lines(self) -> str:
        """slurm.conf's NodeName lines."""
        return (f"NodeName={self.nodename} NodeAddr=127.0.0.1 CPUs={self.cpus} "
                f"RealMemory={_mem_mb()} State=UNKNOWN")

    def slurmd_commands(self) -> list[tuple[str, list[str]]]:
        """(name, argv) of every slurmd to start (in the foreground, -D)."""
        return [("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.nodename])]

    def _start(self) -> None:
        root = self.root
        assert root is not None
        root.chmod(0o755)
        for d in ("state", "spool", *(f"spool/{n}" for n in self.node_names())):
            (root / d).mkdir(mode=0o755)
        sock = root / "munge.sock"
        ctld_port, slurmd_port = _free_ports(2)
        user = _username()
        (root / "slurm.conf").write_text(f"""\
ClusterName=e2e
SlurmctldHost={self.controller()}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge=3600
KillWait=2
InactiveLimit=0
SlurmdParameters=config_overrides
{self.node_lines()}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
{self.extra_conf}
""")
        self.env = {"SLURM_CONF": str(self.conf)}
        daemon_env = self.client_env()

        key = root / "munge.key"                    # what `mungekey --create` makes, by hand
        key.touch(mode=0o600)
        key.write_bytes(os.urandom(1024))

        self._sup = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
            stderr=open(root / "supervisor.log", "w"))
        self._spawn("munged", [_which("munged"), "-F", f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
                               f"--seed-file={root}/munged.seed"], daemon_env)
        self._wait_for("munged", lambda: sock.exists() and subprocess.run(
            [_which("munge"), "-n", "-S", str(sock)], capture_output=True).returncode == 0)
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-f", str(self.conf)], daemon_env)
        for name, argv in self.slurmd_commands():
            self._spawn(name, argv, daemon_env)
        self._wait_for("slurmd", lambda: self._node_state().split() == ["idle"] * self.nodes)

    def _spawn(self, name: str, argv: list, env: dict) -> None:
        assert self._sup is not None and self._sup.stdin and self._sup.stdout
        log = str(self.root / f"{name}.out")      # type: ignore[operator]
        self._sup.stdin.write(json.dumps({"name": name, "argv": argv, "env": env, "log": log})
                              + "\n")
        self._sup.stdin.flush()
        reply = self._sup.stdout.readline().strip()
        if not reply.startswith("ok"):
            raise SlurmStartError(f"could not spawn {name}: {reply or 'supervisor died'}\n"
                                  + self.logs())

    def _wait_for(self, what: str, ready, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exits = self.root / "exits.log"        # type: ignore[operator]
            if exits.exists() and exits.read_text().strip():
                raise SlurmStartError(f"a daemon exited while waiting for {what}:\n"
                                      + self.logs())
            if ready():
                return
            time.sleep(0.1)
        raise SlurmStartError(f"{what} not ready after {timeout:.0f} s "
                              f"(node state: {self._node_state()!r})\n" + self.logs())

    def _node_state(self) -> str:
        r = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else ""

    # ---------------------------------------------------------------- clients
    def client_env(self, env: dict | None = None) -> dict:
        """os.environ without an outer Slurm's variables (pytest itself may run in a job), plus
        .env, plus env."""
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_"))}
        return {**base, **self.env, **(env or {})}

    def run(self, argv: list, env: dict | None = None, check: bool = True,
            timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        argv = [_which(argv[0]) or argv[0], *argv[1:]]
        return subprocess.run(argv, env=self.client_env(env), capture_output=True, text=True,
                              check=check, timeout=timeout, **kw)

    def sbatch(self, script: str | Path, *args: str, env: dict | None = None,
               cwd: str | Path | None = None) -> str:
        """Submit a script file (Path) or script text (str starting with #!); returns the job id.
        sbatch's default --export=ALL passes the client environment (os.environ + .env + env).
        cwd (the job's working directory and where slurm-%j.out goes) defaults to the cluster's
        own directory, not the checkout."""
        if isinstance(script, Path) or not script.startswith("#!"):
            argv, stdin = ["sbatch", "--parsable", *args, str(script)], None
        else:
            argv, stdin = ["sbatch", "--parsable", *args], script
        try:
            r = self.run(argv, env=env, input=stdin, cwd=cwd or self.root)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"sbatch failed ({e.returncode}): {e.stderr}") from e
        return r.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict:
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait(self, job_id: str, timeout: float = 60) -> JobResult:
        """Poll `scontrol show job` (no slurmdbd, so no sacct) until the job ends."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            state = fields.get("JobState", "")
            if state in TERMINAL_STATES:
                code, _, sig = fields.get("ExitCode", "0:0").partition(":")
                return JobResult(str(job_id), state, int(code), int(sig or 0), fields)
            if time.monotonic() > deadline:
                self.run(["scancel", str(job_id)], check=False)
                raise TimeoutError(f"job {job_id} still {state} after {timeout:.0f} s")
            time.sleep(0.2)

    # ---------------------------------------------------------------- stop
    def stop(self, remove: bool = True) -> None:
        if self._sup is not None:
            if self._sup.poll() is None:
                with contextlib.suppress(Exception):
                    self._cancel_all()
            with contextlib.suppress(OSError, ValueError):
                self._sup.stdin.close()          # type: ignore[union-attr]
            try:
                self._sup.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._sup.pid, signal.SIGKILL)
                self._sup.wait()
            self._sup.stdout.close()             # type: ignore[union-attr]
            self._sup = None
        if remove and self.root is not None and not os.environ.get("SLURM_E2E_KEEP"):
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def _cancel_all(self, timeout: float = 15) -> None:
        ids = self.run(["squeue", "-h", "-o", "%A"], timeout=10).stdout.split()
        if not ids:
            return
        self.run(["scancel", *ids], check=False, timeout=10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run(["squeue", "-h", "-o", "%A"], timeout=10).stdout.split():
                return
            time.sleep(0.2)

    def __enter__(self) -> "SlurmCluster":
        return self.start() if self.root is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def _username() -> str:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


@contextlib.contextmanager
def local_slurm_cluster(parent: str | Path = "/tmp", **kw) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(parent, **kw)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


if __name__ != "__main__":                           # the supervisor does not need pytest
    import pytest

    def started(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
        """A fixture's body: `cluster` started (skipped for a non-root user who cannot start
        it, failed with the daemons' logs otherwise) and stopped after its tests."""
        try:
            cluster.start()
        except (SlurmStartError, OSError, subprocess.SubprocessError) as e:
            cluster.stop()
            if os.getuid() != 0:
                pytest.skip(f"Slurm is installed but could not be started as non-root "
                            f"uid {os.getuid()} (run as root): {str(e)[:2000]}")
            pytest.fail(f"Slurm is installed but the cluster did not start: {e}",
                        pytrace=False)
        try:
            yield cluster
        finally:
            cluster.stop()

    @pytest.fixture(scope="session")
    def slurm_cluster() -> Iterator[SlurmCluster]:
        missing = missing_binaries()
        if missing:
            pytest.skip(f"{INSTALL_HINT}; missing: {' '.join(missing)}")
        yield from started(SlurmCluster())


# ------------------------------------------------------------------------------- supervisor
def _descendants(pid: int) -> list[int]:
    """Every live process below pid (from the ppid fields of /proc/*/stat)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _reap_all() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _signal_and_wait(pids: list[int], sig: int, wait: float) -> None:
    """Send sig to pids, then reap until none of them is left below us (or wait runs out)."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        _reap_all()
        if not set(pids) & set(_descendants(os.getpid())):
            return
        time.sleep(0.05)


def _supervise(root: str) -> int:
    """Spawn daemons on request (JSON lines on stdin), reap everything re-parented here, and on
    stdin EOF or SIGTERM stop the daemons (slurmd, slurmctld, munged, in that order), then every
    remaining descendant (slurmstepd, job processes), by pid: SIGTERM, 2 s, SIGKILL."""
    import ctypes
    import select
    PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    named: dict[int, str] = {}
    exits = open(os.path.join(root, "exits.log"), "a")

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in named:
                exits.write(f"{named.pop(pid)} (pid {pid}) exited: status "
                            f"{os.waitstatus_to_exitcode(status)}\n")
                exits.flush()

    while not stop:
        with contextlib.suppress(InterruptedError):
            ready, _, _ = select.select([sys.stdin], [], [], 0.2)
        reap()
        if not ready:
            continue
        line = sys.stdin.readline()
        if not line:
            break
        req = json.loads(line)
        try:
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            pid = os.posix_spawn(req["argv"][0], req["argv"], req["env"], file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1), (os.POSIX_SPAWN_DUP2, fd, 2)])
            os.close(fd)
            named[pid] = req["name"]
            print(f"ok {pid}", flush=True)
        except OSError as e:
            print(f"error {e}", flush=True)

    exits.close()
    os.unlink(os.path.join(root, "exits.log"))      # planned exits are not start-up failures
    order = {"slurmd": 0, "slurmctld": 1, "munged": 2}
    for pid, _ in sorted(named.items(), key=lambda kv: order.get(kv[1], 3)):
        _signal_and_wait([pid], signal.SIGTERM, 10)
    for _ in range(10):
        left = _descendants(os.getpid())
        if not left:
            break
        _signal_and_wait(left, signal.SIGTERM, 2)
        _signal_and_wait(_descendants(os.getpid()), signal.SIGKILL, 5)
    _reap_all()
    if not os.environ.get("SLURM_E2E_KEEP"):         # also when pytest itself was killed
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(_supervise(sys.argv[1]))
