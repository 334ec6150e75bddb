"""model commodity (perfmodel/commodity.py): each GRAD_COMM mode's bytes from its Mode facts, the
Ethernet rate, a GPU without a published rate priced by roofline's ratio and said so, the table,
and its one-line errors. CPU only, nothing traced: the compute is given."""

from __future__ import annotations

import pytest

from bertperf.__main__ import main
from bertperf.perfmodel import bert, commodity, gpus, network, scale
from bertperf.train.comm import MODES
from tests.support.paths import ROOT
from tests.unit.test_model_scale import number, tables

PARAMETERS = 336_232_258
V100 = gpus.GPUS["V100 32GB"]


@pytest.fixture
def given_compute(monkeypatch):
    """The compute given (nothing traced), run in the checkout's root as a user runs it; the
    roofline ratio of a GPU without a published rate given too (1.5)."""
    monkeypatch.setattr(commodity, "modelled", lambda batch, packed: bert.Compute(
        0.003 * batch, 0.002 * batch, 0.0126, "given"))
    monkeypatch.setattr(bert, "roofline_speedup", lambda frm, to: 1.5)
    monkeypatch.chdir(ROOT)


def test_grad_comm_bytes_per_mode():
    """Bytes over all ranks a step: the fp32 gradient; half of it in bf16 and fp16; PowerSGD at
    rank 4 counted by hand on BERT-large's shapes (every weight matrix but the token-type
    embeddings and the 2-way NSP classifier, whose rank-4 factors are not 2x smaller); none under
    localsgd (its average is amortised: test_localsgd_...)."""
    def total(mode, rank=4):
        return sum(map(sum, commodity.mode_messages(MODES[mode], rank)))

    assert total("allreduce") == 4 * PARAMETERS
    assert total("bf16") == total("fp16") == 2 * PARAMETERS
    d, ff, vocab, r = 1024, 4096, 30528, 4  # the vocabulary padded to a multiple of 8
    layer = [(3 * d, d), (d, d), (ff, d), (d, ff)]  # QKV, attention output, the FFN's two
    matrices = [(vocab, d), (512, d), *24 * layer, (d, d), (d, d)]  # + pooler, MLM transform
    whole = PARAMETERS - sum(n * m for n, m in matrices)
    factors = r * sum(n + m for n, m in matrices)
    assert whole + factors == pytest.approx(2.08e6, rel=0.01)  # docs/slow_networks.md: 2.08M
    assert total("powersgd") == 4 * (whole + factors)
    assert total("powersgd_bf16") == 2 * (whole + factors)
    assert total("powersgd", 1) == 4 * (whole + factors // 4)
    assert total("localsgd") == 0


def commodity_run(nodes: int = 4, gpus: int = 8):
    return scale.Run("commodity", nodes, gpus, 16, 3072 // (nodes * gpus * 16), False, 1.0,
                     2_768_215, "RCP 3072", 175_000)


def commodity_net(gbit: float, per_node: int = 8) -> network.Network:
    return network.Network(per_node, V100.pcie, gbit * 1e9 / 8, 1,
                           network.ALPHA_PCIE_US * 1e-6, network.ALPHA_NET_US * 1e-6, "ring",
                           "hierarchical")


COMPUTE = bert.Compute(micro_step=0.14, backward=0.09, optimizer=0.04, source="given")


def mode(name: str, gbit: float = 10, factor: float = 1.0, **kwargs):
    args = dict(overlap=1.0, rank=4, period=8, warmup=100) | kwargs
    return commodity.commodity_mode(commodity_run(), COMPUTE, V100, commodity_net(gbit), name,
                                factor=factor, **args)


def test_one_nic_a_node_shared_by_its_gpus_and_10_gbit_slower_than_25():
    """Across nodes each GPU's M/G at NIC/G: a node's link carries 2 (N-1)/N M, as in
    docs/slow_networks.md (1.6 s a step for 1.34 GB on 4 nodes at 10 Gb/s)."""
    ten, twentyfive = mode("allreduce", 10), mode("allreduce", 25)
    assert ten.step.comm.network == pytest.approx(2 * 3 / 4 * 4 * PARAMETERS / 1.25e9, rel=0.01)
    assert ten.step.comm.network == pytest.approx(2.5 * twentyfive.step.comm.network, rel=0.01)
    assert ten.step.time.step_seconds > twentyfive.step.time.step_seconds + 0.5
    assert ten.seconds_to_train > twentyfive.seconds_to_train
    assert ten.step.time.dominant == "all-reduce across nodes"


def test_compressed_modes_change_the_bytes_the_steps_and_the_compute():
    plain, bf16, powersgd = mode("allreduce"), mode("bf16"), mode("powersgd", factor=1.33)
    assert bf16.world_bytes == plain.world_bytes / 2
    assert bf16.step.comm.network == pytest.approx(plain.step.comm.network / 2, rel=0.01)
    assert powersgd.world_bytes < plain.world_bytes / 100
    assert 0 < powersgd.step.compression < 0.1 and plain.step.compression == 0
    # 1.33x the samples, the first 100 steps (the warm-up) a plain all-reduce
    assert powersgd.step.time.steps == pytest.approx(1.33 * plain.step.time.steps)
    assert powersgd.start == 100 and bf16.start == 0
    assert powersgd.seconds_to_train == pytest.approx(
        powersgd.step.time.seconds
        + 100 * (plain.step.time.step_seconds - powersgd.step.time.step_seconds))


def test_localsgd_sends_the_parameters_once_a_period_and_all_reduces_in_the_node():
    plain, local = mode("allreduce"), mode("localsgd", period=8)
    assert local.world_bytes == plain.world_bytes / 8
    average = network.allreduce(4 * PARAMETERS, 4, commodity_net(10)).scaled(1 / 8)
    assert local.step.comm.network == pytest.approx(average.network)
    assert local.step.comm.nvlink == pytest.approx(plain.step.comm.nvlink + average.nvlink,
                                                   rel=0.01)
    assert mode("localsgd", period=16).step.time.step_seconds < local.step.time.step_seconds


def test_a_gpu_without_a_published_rate_is_priced_by_roofline_and_says_so():
    """The V100's compute: the ratio of its published DeepLearningExamples rate to the A100's; the
    RTX cards have none, so roofline's ratio of the trainer's step on the two datasheets."""
    k, how = commodity.slowdown(V100)
    assert k == pytest.approx(210 / 75)
    assert how.startswith("calibrated: published BERT-large rates, 210 / 75 seq/s")
    k, how = commodity.slowdown(gpus.GPUS["RTX 3090"])
    assert how.startswith("derived: no published BERT-large rate") and "A100 80GB SXM" in how
    a100 = bert.roofline_speedup(("A100 80GB SXM", "fp16"), ("A100 80GB SXM", "fp16"))
    assert a100 == 1.0 and k > 1.5  # 71 dense TFLOP/s against 312 and 936 GB/s against 2,039


def test_cli_prints_the_commodity_table(given_compute, capsys):
    modes = ["allreduce", "bf16", "powersgd", "localsgd"]
    assert main(["model", "commodity", "--grad-comm", ",".join(modes)]) == 0
    out = capsys.readouterr().out
    assert "model predictions, not measurements" in out
    how = [line.split(") x ", 1)[1] for line in out.splitlines() if line.startswith("compute on")]
    assert [h.split(", ")[1] for h in how] == [
        "calibrated: published BERT-large rates", "derived: no published BERT-large rate of it "
        "(bert_dle_fp16)", "derived: no published BERT-large rate of it (bert_dle_fp16)"]
    assert "arXiv 2008.00177" in out and "names no hardware" in out
    (rows,) = tables(out)
    assert [(r["cluster"], r["GRAD_COMM"]) for r in rows] == [
        (f"4 x 8 {gpu}, {gbit} Gb/s Ethernet", m) for gpu in commodity.DEFAULT_GPUS
        for gbit in (10, 25) for m in modes]
    rows = [r for r in rows if "V100" in r["cluster"]]
    by = {(r["cluster"].split(", ")[1], r["GRAD_COMM"]): r for r in rows}
    for r in rows:  # the given 3 ms a sequence x 2.8 (210 / 75), 16 a micro-batch, 6 of them
        assert number(r["compute ms"]) == pytest.approx(0.003 * 16 * 210 / 75 * 6e3, abs=0.5)
        assert r["Lin et al. 2020"].startswith("12 days")
    ten = "10 Gb/s Ethernet"
    assert number(by[ten, "bf16"]["MB a step across nodes (a GPU's collectives / each node's "
                                  "link)"]) == pytest.approx(4 * PARAMETERS / 2e6, abs=0.1)
    assert number(by[ten, "powersgd"]["samples to converge"]) == pytest.approx(1.33 * 2_768_215,
                                                                              abs=1)
    assert number(by[ten, "powersgd"]["compression ms"]) > 0
    step = [number(by[ten, m]["step ms"]) for m in modes]
    assert step[0] > step[1] > step[2] and step[0] > step[3]
    assert number(by[ten, "allreduce"]["step ms"]) > number(by["25 Gb/s Ethernet",
                                                                "allreduce"]["step ms"])


@pytest.mark.parametrize("flags", [
    ["--grad-comm", "zip"], ["--gpu", "H100 80GB SXM"], ["--nodes", "5"],
    ["--samples-factor", "powersgd"], ["--nodes", "0"], ["--overlap", "2"],
    ["--algorithm", "star"], ["--configs", "no_such_config.sh"],
])
def test_cli_rejects_bad_flags_with_one_line(given_compute, capsys, flags):
    assert main(["model", "commodity", *flags]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("bertperf: error: ")
    assert flags[-2] in err or flags[-1] in err
