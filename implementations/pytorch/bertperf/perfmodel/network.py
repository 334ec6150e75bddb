"""How a cluster's GPUs are joined and what a collective costs on it: NCCL's own cost model's
terms (src/graph/tuning.cc; NVIDIA/nccl at 01afd20) for ring and tree all-reduces, reduce-scatters
and SHARP's in-network reduction, hierarchical (in the node, then across nodes) or flat, and the
named networks `plan` knows. A model, not a measurement.

All-reduce of M bytes over p GPUs, latency alpha a step and bandwidth B a GPU and direction:

  ring   2 (p-1) alpha + 2 (p-1)/p M / B        (reduce-scatter then all-gather)
  tree   2 ceil(log2 p) alpha + 2 M / B          (pipelined double binary tree, NCCL)
  auto   (default) the faster of the two for each message, as NCCL's tuner picks by its model
  hierarchical (default), nodes of G GPUs on NVSwitch (or PCIe), N nodes on the network:
         reduce-scatter in the node   (G-1) a_nvl + (G-1)/G M / B_nvl
         all-reduce across the nodes  ring or tree of M/G bytes, each GPU on its share of the
                                      node's NICs
         all-gather in the node       as the reduce-scatter
  flat   one ring or tree over all N G GPUs, every step at a GPU's share of the NICs
One node: the ring or tree over its G GPUs. A ring all-reduce takes 2 (nRanks-1) steps, 2
(nNodes-1) of them on the network; a tree 2 (log2 nNodes) network hops; their algorithm
bandwidths busBw nRanks/(2 (nRanks-1)) and busBw/2; the per-step latencies are NCCL's defaults
(hwLat, Simple protocol: the one for large messages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bertperf.perfmodel.gpus import PCIE4_X16

NVLINK_GBPS = 300.0
"""NVSwitch bandwidth a GPU and direction on a DGX A100, busbw-equivalent, GB/s: third-generation
NVLink gives an A100 600 GB/s in all (NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020:
six NVSwitches, GPU-to-GPU 600 GB/s). NCCL's own model caps an A100's busBw at 235 (tuning.cc)."""
NIC_GBIT = 200.0
NICS_PER_NODE = 8
"""DGX A100: eight single-port ConnectX-6 HDR InfiniBand adapters at 200 Gb/s, one a GPU, for the
compute fabric (NVIDIA, "Defining AI Innovation with NVIDIA DGX A100", developer.nvidia.com
blog, 2020)."""
ALPHA_NVLINK_US, ALPHA_NET_US, ALPHA_PCIE_US = 3.4, 9.6, 5.7
"""Per-step latency of a ring all-reduce on NVLink, on the network and on PCIe, microseconds
(NCCL src/graph/tuning.cc hwLat, Ring/Simple). NCCL's model has one network value for every
network, sockets over Ethernet included."""


@dataclass(frozen=True)
class Network:
    """How a cluster's GPUs are joined."""

    gpus_per_node: int
    nvlink: float
    """The fabric in the node (or the NVLink domain) a GPU and direction, bytes/s
    (busbw-equivalent): NVSwitch, or a commodity node's PCIe link."""
    nic: float
    """One NIC's bandwidth a direction, bytes/s: InfiniBand, or a commodity node's Ethernet."""
    nics_per_node: int
    alpha_nvlink: float = ALPHA_NVLINK_US * 1e-6
    """Seconds a step in the node (NVLink or PCIe)."""
    alpha_net: float = ALPHA_NET_US * 1e-6
    """Seconds a step on the network."""
    algorithm: str = "auto"
    """ring, tree or auto (the faster of the two for each all-reduce): the all-reduce across the
    nodes (flat: over all GPUs; one node: in it)."""
    topology: str = "hierarchical"
    """hierarchical (reduce-scatter in the node, all-reduce across nodes, all-gather in the node)
    or flat (one all-reduce over every GPU at its share of the NICs)."""
    nvlink_domain: int = 0
    """GPUs one NVLink/NVSwitch fabric joins when it spans nodes (an NVL72 rack's); 0: a node."""
    sharp: bool = False
    """InfiniBand with SHARP in the switches: the all-reduce across nodes reduced in the
    network (NVIDIA's multi-node configs ask for it: SBATCH_NETWORK=sharp)."""
    name: str = ""

    @property
    def nic_per_gpu(self) -> float:
        return self.nics_per_node * self.nic / self.gpus_per_node

    @property
    def domain(self) -> int:
        """GPUs joined by the fabric in the node (or the NVLink domain)."""
        return self.nvlink_domain or self.gpus_per_node


@dataclass(frozen=True)
class Comm:
    """Seconds an all-reduce spends on each fabric."""

    nvlink: float = 0.0
    network: float = 0.0

    @property
    def total(self) -> float:
        return self.nvlink + self.network

    def __add__(self, other: Comm) -> Comm:
        return Comm(self.nvlink + other.nvlink, self.network + other.network)

    def scaled(self, factor: float) -> Comm:
        return Comm(self.nvlink * factor, self.network * factor)


def ring_allreduce(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    """2 (p-1) alpha + 2 (p-1)/p M / B."""
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * nbytes / bandwidth


def tree_allreduce(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    """2 ceil(log2 p) alpha + 2 M / B."""
    if ranks < 2:
        return 0.0
    return 2 * math.ceil(math.log2(ranks)) * alpha + 2 * nbytes / bandwidth


def reduce_scatter(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    """(p-1) alpha + (p-1)/p M / B (an all-gather takes the same)."""
    if ranks < 2:
        return 0.0
    return (ranks - 1) * alpha + (ranks - 1) / ranks * nbytes / bandwidth


def sharp(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    """In-network reduction: each GPU's bytes go up to the switches once and come back once."""
    return 2 * alpha + nbytes / bandwidth if ranks > 1 else 0.0


ALGORITHMS = {"ring": ring_allreduce, "tree": tree_allreduce}
CHOICES = (*ALGORITHMS, "auto")
TOPOLOGIES = ("hierarchical", "flat")


def allreduce(nbytes: float, nodes: int, net: Network) -> Comm:
    """One all-reduce of `nbytes` on every GPU of `nodes` nodes (module docstring); algorithm
    auto: the faster of ring and tree, as NCCL's tuner picks one for each call by its model."""
    if net.algorithm == "auto":
        return min((allreduce(nbytes, nodes, replace(net, algorithm=a)) for a in ALGORITHMS),
                   key=lambda c: c.total)
    algo, g = ALGORITHMS[net.algorithm], net.gpus_per_node
    if nodes == 1:
        return Comm(nvlink=algo(nbytes, g, net.nvlink, net.alpha_nvlink))
    if net.topology == "flat":
        return Comm(network=algo(nbytes, nodes * g, net.nic_per_gpu, net.alpha_net))
    in_node = 2 * reduce_scatter(nbytes, g, net.nvlink, net.alpha_nvlink)
    return Comm(nvlink=in_node, network=algo(nbytes / g, nodes, net.nic_per_gpu, net.alpha_net))


def _dgx(name: str, nvlink_gbps: float, nic_gbit: float) -> Network:
    return Network(8, nvlink_gbps * 1e9, nic_gbit * 1e9 / 8, 8, sharp=True, name=name)


def _pcie(name: str, nic_gbit: float) -> Network:
    return Network(8, PCIE4_X16, nic_gbit * 1e9 / 8, 1, alpha_nvlink=ALPHA_PCIE_US * 1e-6,
                   name=name)


FABRICS = {f.name: f for f in (
    _dgx("dgx-a100", NVLINK_GBPS, NIC_GBIT), _dgx("dgx-h100", 450, 400),
    _dgx("dgx-b200", 900, 400),
    Network(4, 900e9, 400e9 / 8, 4, nvlink_domain=72, name="gb200-nvl72"),
    _pcie("pcie-10gbe", 10), _pcie("pcie-25gbe", 25), _pcie("pcie-100gbe", 100),
)}
"""The known networks `plan` takes by name. DGX A100: NVSwitch 600 GB/s a GPU (300 a direction),
eight 200 Gb/s HDR InfiniBand NICs; DGX H100: 900 GB/s NVLink 4 (450), eight 400 Gb/s NDR NICs;
DGX B200: 1.8 TB/s NVLink 5 (900), eight 400 Gb/s NICs (NVIDIA's DGX datasheets); each with
SHARP, as NVIDIA's multi-node configs ask for it. GB200 NVL72: 72 GPUs on one NVLink 5 domain,
compute trays of 4 GPUs with four 400 Gb/s NICs (NVIDIA GB200 NVL72 datasheet). pcie-*: nodes of
GPUs on PCIe 4.0 x16 (NCCL's PCI latency) with one Ethernet NIC a node."""
