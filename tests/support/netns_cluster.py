"""A real two-node Slurm cluster on one machine: each node a Linux network namespace with its own
address, its own slurmd and its own host name, under one slurmctld (slurm_cluster.py's private
cluster: munged, slurm.conf, state and logs in one fresh directory under /tmp).

Network: a bridge in the root namespace holds the controller's address (.1 of a private /24 not
in use on this machine); node k is namespace `<prefix>n<k>` joined to the bridge by a veth pair,
its end `eth0` at .1<k> (n1 = .11, n2 = .12). `ip netns exec` bind-mounts
/etc/netns/<namespace>/hosts over /etc/hosts for the processes it starts, so inside a node the
names n1, n2 and ctl resolve to those addresses (torch's rendezvous and gloo need the node's own
name to resolve to its address). It also mounts a fresh /sys, which hides the cgroup file
systems slurmd 22.05 looks for: each slurmd starts through a small script that mounts them again
in that private mount namespace, then runs `slurmd -D -N n<k>` in a UTS namespace of its own
whose host name is n<k>. Jobs inherit all of it: a task on n2 sees only n2's address and names.

`cut(node)` / `mend(node)` take a node's link down and up (`ip link set eth0 down` inside it);
`remote_shell(path)` writes an agent that enters a node as ssh would (mpirun's plm_rsh_agent).

Tear-down stops the daemons (the supervisor of slurm_cluster.py) and removes the namespaces, the
veth pairs, the bridge and the /etc/netns entries, also when a test fails. Needs root, iproute2
and Slurm + munge; the fixture skips with the reason otherwise.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.slurm_cluster import (SlurmCluster, SlurmStartError, _which,
                                         missing_binaries, started)

SLURMD_IN_NAMESPACE = """\
#!/bin/sh
# run by `ip netns exec`: the cgroup file systems again (hidden by its fresh /sys), then slurmd
# in a UTS namespace named after the node
set -e
mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup
for c in cpu cpuacct cpuset memory devices freezer blkio pids; do
  mkdir -p /sys/fs/cgroup/$c
  mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c 2>/dev/null || rmdir /sys/fs/cgroup/$c
done
mkdir -p /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified 2>/dev/null || true
exec unshare --uts /bin/sh -c "hostname $1; exec $2 -D -f $3 -N $1"
"""


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.2xx.y.0/24 that no address of this machine is in."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for third in range(64, 256):
        net = ipaddress.ip_network(f"10.231.{third}.0/24")
        if f" 10.231.{third}." not in used:
            return net
    raise SlurmStartError("no free 10.231.x.0/24 subnet for the namespace cluster")


class NetnsSlurmCluster(SlurmCluster):
    """Nodes n1..n<nodes>, each a network namespace with `cpus` CPUs (module docstring)."""

    def __init__(self, nodes: int = 2, cpus: int = 2) -> None:
        # a node whose link is cut is DOWN (and its job step ended) after SlurmdTimeout, and back
        # in service when it answers again (ReturnToService=2)
        super().__init__(cpus=cpus, extra_conf="SlurmdTimeout=10\n")
        self.nodes = nodes
        self.prefix = f"bp{os.getpid() % 100000}"
        self.bridge = f"{self.prefix}br"
        self.net = free_subnet()
        self.made: list[list[str]] = []  # undo commands, in order of making

    def address(self, node: int) -> str:
        return str(self.net.network_address + 10 + node)

    def namespace(self, node: int) -> str:
        return f"{self.prefix}n{node}"

    def remote_shell(self, path: Path) -> Path:
        """An agent at `path` that runs a command on a node as ssh would (`<agent> n<k>
        <command line>`): in the node's namespace, under the node's own host name (daemons that
        share one share Open MPI's session folder, docs/design.md). For `mpirun`'s
        plm_rsh_agent."""
        path.write_text("#!/bin/sh\nhost=$1; shift\n"
                        f'exec ip netns exec "{self.prefix}$host" unshare --uts '
                        '/bin/sh -c "hostname $host; exec $*"\n')
        path.chmod(0o755)
        return path

    # ---- slurm.conf and daemons (SlurmCluster's hooks)
    def controller(self) -> str:
        return f"{self.nodename}({self.net.network_address + 1})"

    def node_names(self) -> list[str]:
        return [f"n{k}" for k in range(1, self.nodes + 1)]

    def node_lines(self) -> str:
        return "\n".join(f"NodeName=n{k} NodeAddr={self.address(k)} NodeHostname=n{k} "
                         f"CPUs={self.cpus} RealMemory=2000 State=UNKNOWN"
                         for k in range(1, self.nodes + 1))

    def slurmd_commands(self) -> list[tuple[str, list[str]]]:
        script = self.root / "slurmd-in-namespace.sh"
        script.write_text(SLURMD_IN_NAMESPACE)
        return [(f"slurmd-n{k}", [_which("ip"), "netns", "exec", self.namespace(k), "/bin/sh",
                                  str(script), f"n{k}", _which("slurmd"), str(self.conf)])
                for k in range(1, self.nodes + 1)]

    # ---- the network
    def _ip(self, *args: str, undo: list[str] | None = None) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if r.returncode:
            raise SlurmStartError(f"ip {' '.join(args)}: {r.stderr.strip()}")
        if undo:
            self.made.append(undo)

    def _start(self) -> None:
        hosts = "127.0.0.1 localhost\n" + f"{self.net.network_address + 1} ctl\n" + "".join(
            f"{self.address(k)} n{k}\n" for k in range(1, self.nodes + 1))
        self._ip("link", "add", self.bridge, "type", "bridge",
                 undo=["link", "del", self.bridge])
        self._ip("addr", "add", f"{self.net.network_address + 1}/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for k in range(1, self.nodes + 1):
            ns, veth = self.namespace(k), f"{self.prefix}v{k}"
            self._ip("netns", "add", ns, undo=["netns", "del", ns])
            folder = Path("/etc/netns") / ns
            folder.mkdir(parents=True, exist_ok=True)
            self.made.append(["rm", str(folder)])
            (folder / "hosts").write_text(hosts)
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
                     undo=["link", "del", veth])
            self._ip("link", "set", veth, "master", self.bridge)
            self._ip("link", "set", veth, "up")
            self._ip("netns", "exec", ns, "ip", "addr", "add", f"{self.address(k)}/24", "dev",
                     "eth0")
            self._ip("netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            self._ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        super()._start()

    def cut(self, node: int) -> None:
        self._ip("netns", "exec", self.namespace(node), "ip", "link", "set", "eth0", "down")

    def mend(self, node: int) -> None:
        self._ip("netns", "exec", self.namespace(node), "ip", "link", "set", "eth0", "up")

    def stop(self, remove: bool = True) -> None:
        try:
            super().stop(remove)
        finally:
            for undo in reversed(self.made):
                if undo[0] == "rm":
                    shutil.rmtree(undo[1], ignore_errors=True)
                else:
                    subprocess.run(["ip", *undo], capture_output=True)
            self.made.clear()


@pytest.fixture(scope="module")
def netns_cluster() -> Iterator[NetnsSlurmCluster]:
    if os.getuid() != 0:
        pytest.skip("network namespaces and their slurmd need root")
    missing = missing_binaries() + [b for b in ("ip", "unshare") if _which(b) is None]
    if missing:
        pytest.skip(f"not installed: {' '.join(missing)} (make setup as root)")
    yield from started(NetnsSlurmCluster())
