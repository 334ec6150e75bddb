"""model scale's performance model: the all-reduce formulas on known inputs (perfmodel/network.py),
hierarchical against flat, the gradient messages against the model's parameters, the dominant
term moving from the compute to the network as the GPUs grow at a fixed local batch, time to
train from its steps and evals, a config file's run, and the command (its table, its one-line
errors). CPU only, nothing traced: the compute is given."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import pytest

from bertperf.__main__ import main
from bertperf.perfmodel import bert, network, scale
from tests.support.paths import ROOT

NET = network.Network(gpus_per_node=8, nvlink=300e9, nic=25e9, nics_per_node=8,
                      alpha_nvlink=3.4e-6, alpha_net=9.6e-6, algorithm="ring",
                      topology="hierarchical")


def run_of(nodes: int, batch: int = 16, samples: float = 3e6, interval: int = 175_000):
    return scale.Run("test", nodes, 8, batch, 1, False, 1.0, samples, "test", interval)


def test_ring_and_tree_formulas_on_known_inputs():
    # 8 GB over 8 ranks at 100 GB/s, 1 us a step
    assert network.ring_allreduce(8e9, 8, 100e9, 1e-6) == pytest.approx(14e-6 + 2 * 7 / 8 * 0.08)
    assert network.tree_allreduce(8e9, 8, 100e9, 1e-6) == pytest.approx(6e-6 + 0.16)
    assert network.reduce_scatter(8e9, 8, 100e9, 1e-6) == pytest.approx(7e-6 + 7 / 8 * 0.08)
    assert network.tree_allreduce(1.0, 1000, 1e12, 1e-6) == pytest.approx(20e-6, rel=1e-3)
    for f in (network.ring_allreduce, network.tree_allreduce, network.reduce_scatter):
        assert f(8e9, 1, 100e9, 1e-6) == 0.0


def test_hierarchical_against_flat():
    m = 1e9
    one = network.allreduce(m, 1, NET)
    assert one == network.allreduce(m, 1, replace(NET, topology="flat"))
    assert one.network == 0 and one.nvlink == pytest.approx(network.ring_allreduce(m, 8, 300e9,
                                                                                 3.4e-6))
    hier = network.allreduce(m, 128, NET)
    assert hier.nvlink == pytest.approx(2 * network.reduce_scatter(m, 8, 300e9, 3.4e-6))
    assert hier.network == pytest.approx(network.ring_allreduce(m / 8, 128, 25e9, 9.6e-6))
    flat = network.allreduce(m, 128, replace(NET, topology="flat"))
    assert flat.nvlink == 0
    assert flat.network == pytest.approx(network.ring_allreduce(m, 1024, 25e9, 9.6e-6))
    assert flat.total > 3 * hier.total  # 8x the bytes and 8x the steps on the network
    # auto: the faster of ring and tree for each message
    tiny, big = 4e6, 1e9
    for nbytes, nodes in ((tiny, 128), (big, 1), (big, 128)):
        auto = network.allreduce(nbytes, nodes, replace(NET, algorithm="auto")).total
        both = [network.allreduce(nbytes, nodes, replace(NET, algorithm=a)).total
                for a in ("ring", "tree")]
        assert auto == min(both)
    assert network.allreduce(tiny, 128, replace(NET, algorithm="tree")).total < \
        network.allreduce(tiny, 128, NET).total  # latency-bound: the tree's log steps win


def test_messages_are_the_model_parameters_bytes():
    import torch

    from bertperf.model import BertConfig, BertForPreTraining

    with torch.device("meta"):
        model = BertForPreTraining(BertConfig.large())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    embeddings = sum(p.numel() * p.element_size() for p in model.bert.embeddings.parameters())
    buckets = bert.gradient_buckets()
    assert sum(buckets) == nbytes > 1.3e9  # BERT-large in float32
    assert sum(bert.gradient_buckets(torch.bfloat16)) == nbytes // 2
    assert buckets[0] <= 2 * 2 ** 20 + nbytes // len(buckets)  # DDP's small first bucket
    assert buckets[-1] >= embeddings  # ready last: the embeddings
    assert len(buckets) == pytest.approx(nbytes / (25 * 2 ** 20), rel=0.4)


def test_dominant_term_moves_from_compute_to_the_network_as_gpus_grow():
    buckets = bert.gradient_buckets()
    compute = bert.Compute(micro_step=0.010, backward=0.0067, optimizer=0.001, source="given")
    small = scale.predict(run_of(1), compute, buckets, NET, overlap=0.0)
    large = scale.predict(run_of(128), compute, buckets, NET, overlap=0.0)
    assert small.time.dominant == "compute" and small.exposed.network == 0
    assert large.time.dominant == "all-reduce across nodes"
    assert large.time.step_seconds > small.time.step_seconds
    # with a long backward, everything but the last bucket hides under it
    long = replace(compute, micro_step=1.0, backward=0.7)
    hidden = scale.predict(run_of(128), long, buckets, NET, overlap=1.0)
    assert hidden.exposed.total == pytest.approx(network.allreduce(buckets[-1], 128, NET).total)
    assert hidden.comm.total == pytest.approx(
        sum(network.allreduce(b, 128, NET).total for b in buckets))
    half = scale.predict(run_of(128), compute, buckets, NET, overlap=0.5)
    assert half.exposed.total == pytest.approx(large.exposed.total - 0.5 * compute.backward)


def test_time_to_train_is_steps_times_the_step_plus_evals():
    buckets = bert.gradient_buckets()
    compute = bert.Compute(0.1, 0.06, 0.01, "given")
    p = scale.predict(run_of(8, batch=48, samples=3_000_000), compute, buckets, NET, 1.0)
    assert p.run.global_batch == 3072
    t = p.time
    assert t.steps == pytest.approx(3_000_000 / 3072)
    assert t.evals == pytest.approx(3_000_000 / 175_000)
    # an eval: each GPU's ceil(10,000 / 64) = 157 samples, 4 micro-batches of 48, a third each
    assert p.eval_seconds == pytest.approx(4 * 0.1 / 3)
    assert t.seconds == pytest.approx(t.steps * t.step_seconds + t.evals * p.eval_seconds)
    assert t.step_seconds == pytest.approx(0.1 + 0.01 + p.exposed.total)


def test_a_config_file_run():
    run = scale.config_run(ROOT / "config_DGXA100_8x8x48x1.sh")
    assert (run.gpus, run.batch, run.global_batch, run.eval_interval) == (64, 48, 3072, 175_000)
    assert run.samples == pytest.approx(2_768_215, rel=1e-3)  # the RCP row's mean
    assert run.published is not None and run.published.minutes == 2.497  # v2.1's, the latest
    assert scale.config_run(ROOT / "config_DGXA100_16x8x36x1.sh").published is None


@pytest.fixture
def given_compute(monkeypatch):
    """The compute given (nothing traced), run in the checkout's root as a user runs it."""
    def modelled(batch, packed):
        return bert.Compute(0.003 * batch, 0.002 * batch, 0.0126, "given")
    monkeypatch.setattr(scale, "modelled", modelled)
    monkeypatch.chdir(ROOT)


def tables(out: str) -> list[list[dict[str, str]]]:
    """The markdown tables of `out`, each a list of {column header: cell} rows."""
    found, lines = [], out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---") and i > 0 and lines[i - 1].startswith("| "):
            header = [c.strip() for c in lines[i - 1].strip("|").split("|")]
            rows = [[c.strip() for c in row.strip("|").split("|")]
                    for row in itertools.takewhile(lambda l: l.startswith("| "), lines[i + 1:])]
            found.append([dict(zip(header, row, strict=True)) for row in rows])
    return found


def number(cell: str) -> float:
    """A cell's leading number ("1,024", "150.0 (measured)", "2.0 (0.8 + 1.2) / 25.2")."""
    return float(cell.split()[0].replace(",", ""))


def seconds(cell: str) -> float:
    """A duration cell ("75.6 s", "14.9 min (logs)") in seconds."""
    value, unit = cell.split()[:2]
    return float(value) * {"s": 1, "min": 60, "h": 3600, "days": 86400}[unit]


def test_cli_prints_the_table(given_compute, capsys):
    """A row a config (and a row a published result): the measured step time where --step-ms
    gives one (56 sequences a GPU: 150 ms), the modelled one elsewhere (3 ms a sequence here),
    --optimizer-ms everywhere, a step the sum of its terms, its dominant term one of them, the
    published time with its logs and the ratio of the two; then the all-reduce by topology and
    algorithm at every GPU count of the rows."""
    assert main(["model", "scale", "--step-ms", "56=150", "--optimizer-ms", "12"]) == 0
    out = capsys.readouterr().out
    runs, allreduce = tables(out)
    # the calibration check's runs, predicted a GPU against their published rate, in one line
    (check,) = [line for line in out.splitlines() if line.startswith("calibration check")]
    assert [check.count(f"{label}: predicted ") for label in scale.CALIBRATION] == [1, 1]
    by_config = {row["config"]: row for row in runs}
    configs = sorted(ROOT.glob("config_DGXA100_*x*.sh"))
    assert {path.name for path in configs} <= set(by_config)
    for row in runs:
        assert row["dominant term"] in scale.TERMS
        batch = int(re.search(r"\d+x\d+x(\d+)x\d+", row["config"])[1])  # a GPU's micro-batch
        compute, source = number(row["compute ms"]), row["compute ms"].split()[1]
        assert (compute, source) == ((150.0, "(measured)") if batch == 56 else
                                     (pytest.approx(3 * batch), "(given)"))
        assert number(row["optimizer ms"]) == 12.0
        assert number(row["step ms"]) == pytest.approx(
            compute + 12.0 + number(row["all-reduce ms exposed (NVLink + IB) / total"]), abs=0.15)
        if row["published"] != "none at this GPU count and batch":
            assert number(row["predicted / published"]) == pytest.approx(  # 0.1 min rounded
                seconds(row["predicted time to train"]) / seconds(row["published"]), rel=0.05)
    ours = by_config["config_DGXA100_1x8x56x1.sh"]
    assert seconds(ours["published"]) == pytest.approx(16.88 * 60)  # v2.1 NVIDIA 1xDGX A100
    for published in scale.load_published():
        (row,) = [r for name, r in by_config.items() if name.startswith(published.label + " (")]
        assert row["published"].endswith(f"({published.source})")
        assert seconds(row["published"]) == pytest.approx(published.minutes * 60, abs=3)
    gpus = sorted({int(number(row["GPUs"])) for row in runs})
    assert list(allreduce[0])[1:] == [f"{n:,} GPUs" for n in gpus]
    assert [row["topology, algorithm"] for row in allreduce] == \
        [f"{t}, {a}" for t in network.TOPOLOGIES for a in network.ALGORITHMS]
    assert all(number(cell) > 0 for row in allreduce for cell in list(row.values())[1:])


@pytest.mark.parametrize("flags", [
    ["--overlap", "1.5"], ["--step-ms", "56"], ["--step-ms", "x=3"], ["--step-ms", "56=-1"],
    ["--algorithm", "star"], ["--topology", "torus"], ["--nvlink-gbps", "-3"],
    ["--nics-per-node", "2.5"], ["--grad-dtype", "int8"], ["--configs", "no_such_config.sh"],
    ["--configs", str(ROOT / "config_DGXH100_1x1x56x4_pack.sh")],
])
def test_cli_rejects_bad_flags_with_one_line(given_compute, capsys, flags):
    assert main(["model", "scale", *flags]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("bertperf: error: ")
    assert flags[-2] in err or flags[-1] in err


def test_without_configs_here_it_says_where_it_looked(given_compute, tmp_path, monkeypatch,
                                                      capsys):
    """The default is the config files of the current folder (the checkout's root, where users
    run it), not of the package's location; with none there, one line naming the folder."""
    monkeypatch.chdir(tmp_path)
    assert main(["model", "scale"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert str(tmp_path) in err and "--configs" in err


def test_published_results_come_from_the_results_table():
    """The published results beside the configs are results.csv's NVIDIA and Samsung DGX A100
    rows (recomputed from their logs), each naming its result folder."""
    from bertperf.perfmodel import results

    published = scale.load_published()
    assert len(published) >= 10
    table = {(r.round, r.organization, r.system): r for r in results.load_results()}
    for p in published:
        m = re.fullmatch(r"(v\d\.\d):([A-Za-z]+)/results/(\S+)", p.source)
        assert m, p.source
        row = table[m.groups()]
        assert (p.minutes, p.samples, p.global_batch, p.nodes, p.division) == \
            (row.minutes, row.samples, row.global_batch, row.nodes, row.division)
    v20 = {p.label: p for p in published}["v2.0 NVIDIA 1xDGX A100"]
    assert (v20.nodes, v20.batch, v20.packed, v20.global_batch, v20.minutes) == \
        (1, 56, False, 448, 18.442)
    assert v20.source == "v2.0:NVIDIA/results/dgxa100_ngc22.04_pytorch"
    samsung = {p.label: p for p in published}["v1.1 Samsung 128xDGX A100"]
    assert (samsung.division, samsung.eval_interval) == ("open", 325_000)


def test_a_malformed_results_table_is_one_line(given_compute, tmp_path, capsys, monkeypatch):
    """A bad cell in the results table: `model scale` stops with results' one line naming the
    file, the line and the column."""
    from bertperf.perfmodel import results

    lines = results.RESULTS.read_text().splitlines()
    table = tmp_path / "results.csv"
    table.write_text("\n".join(lines[:2] + [lines[2].replace(",closed,", ",closd,")]) + "\n")
    load = scale.load_published
    monkeypatch.setattr(scale, "load_published", lambda: load(table))
    assert main(["model", "scale"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [f"bertperf: error: {table}: line 3: division 'closd' is not "
                                "one of closed, open"]


@pytest.mark.slow
def test_the_modelled_compute_comes_from_the_traced_step():
    """The A100 price of the trainer's traced packed step at 2 rows (fake tensors, a few s)."""
    bert.modelled.cache_clear()
    compute = bert.modelled(2, True)
    assert compute.source == "packed model"
    assert 0 < compute.backward < compute.micro_step < 0.1 and 0 < compute.optimizer < 0.1
    # LAMB over all 336 M float32 parameters reads and writes at least 5 x 4 bytes each
    assert compute.optimizer > 5 * 4 * 336e6 / 2.039e12


@pytest.mark.slow
def test_the_calibrated_model_predicts_nvidias_mlperf_a100_rate():
    """The calibration check: the model's prediction for NVIDIA's MLPerf 1xDGX A100 runs (v2.0
    and v2.1, fp16, 56 unpadded sequences a GPU, 8 GPUs; the trainer's traced step priced at the
    calibrated efficiencies of perfmodel/anchors.csv, with the all-reduce, LAMB and the evals) lands
    within 15 % of their published rate, about 300 sequences/s a GPU. It fails when the
    calibration (or what the trainer's step launches) drifts; a few seconds of tracing."""
    bert.modelled.cache_clear()
    predictions = scale.calibration()
    assert [p.run.published.label for p in predictions] == list(scale.CALIBRATION)
    for p in predictions:
        published = scale.published_per_gpu_rate(p.run)
        assert published == pytest.approx(300, abs=5)  # 299 (v2.0) and 304 (v2.1)
        assert (p.run.gpus, p.run.batch, p.run.packed) == (8, 56, False)
        assert p.compute.source == "varlen model"
        assert scale.per_gpu_rate(p) == pytest.approx(published, rel=scale.TOLERANCE)
        assert scale.per_gpu_rate(p) == pytest.approx(300, rel=scale.TOLERANCE)
