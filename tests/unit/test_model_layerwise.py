"""`model layerwise`: a stage's step traced with the model staged by the trainer's own code (a
frozen stage runs its frozen layers forward only), the normal run's prediction the same as model
scale's for one DGX A100 node, and the command's tables. CPU only, on fake tensors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bertperf.__main__ import main
from bertperf.perfmodel import bert, layerwise, scale
from bertperf.model import BertConfig
from tests.support.paths import ROOT


def test_a_frozen_stage_runs_its_frozen_layers_forward_only():
    """BERT-large's layer shapes, 3 layers, 4 sequences: 2 layers with the bottom one frozen
    trace fewer FLOPs than 2 layers all training (no backward, gradient or LAMB for the frozen
    layer and the position and segment embeddings; the word embeddings train from the head:
    LAYERWISE_EMBEDDINGS' default) and more than the 1 trained layer alone (its forward is
    run); the frozen parameters are out of the trained ones (DDP's buckets) and the backward."""
    config = replace(BertConfig.large(), num_hidden_layers=3)
    frozen = layerwise.stage_step(config, 4, "1:1,2:1,3", "new", 1)
    both = layerwise.stage_step(config, 4, "2:1,3", "all", 0)
    alone = layerwise.stage_step(config, 4, "1:1,3", "all", 0)
    assert [(s.layers, s.frozen) for s in (frozen, both, alone)] == [(2, 1), (2, 0), (1, 0)]
    assert both.flops > frozen.flops > alone.flops
    assert frozen.compute.backward < alone.compute.backward < both.compute.backward
    assert frozen.compute.optimizer < alone.compute.optimizer < both.compute.optimizer

    def numel(step):
        return sum(p.numel() for p in step.trained)
    layer = numel(both) - numel(alone)  # one encoder layer's parameters
    assert layer == 12 * 1024 ** 2 + 9 * 1024 + 4096  # weights, biases (FFN 4,096), LayerNorms
    embeddings = numel(alone) - numel(frozen)  # what the frozen stage does not train
    assert embeddings == 512 * 1024 + 2 * 1024 + 2 * 1024  # positions, segments, LayerNorm
    assert sum(bert.gradient_buckets(None, list(frozen.trained))) == 4 * numel(frozen)


@pytest.mark.slow
def test_normal_is_model_scales_single_node_prediction():
    """The normal run's predicted time is model scale's for config_DGXA100_1x8x56x1.sh (its
    modelled step, all of BERT-large's buckets, its default network); stacking's last stage
    and MSLT's are that step too; every run trains the same samples; MSLT's frozen stages step
    faster and all-reduce less than half a whole-model step's bytes (a third of the layers and
    the word embeddings train)."""
    net = scale.network_of("auto", "hierarchical")
    theirs = scale.predict(scale.config_run(ROOT / "config_DGXA100_1x8x56x1.sh"),
                           bert.modelled(56, False), bert.gradient_buckets(), net, 1.0)
    runs = layerwise.gpu_predictions()
    (normal_step, normal), = runs["normal"]
    assert normal.time.seconds == pytest.approx(theirs.time.seconds, rel=1e-9)
    assert normal.time.step_seconds == pytest.approx(theirs.time.step_seconds, rel=1e-9)
    for name in ("stacking", "mslt"):
        stages = runs[name]
        assert sum(p.run.samples for _, p in stages) == pytest.approx(normal.run.samples)
        assert stages[-1][1].time.step_seconds == pytest.approx(normal.time.step_seconds,
                                                                rel=1e-9)
    assert [(s.layers, s.frozen) for s, _ in runs["mslt"]] == [(8, 0), (16, 8), (24, 0)]
    for step, p in runs["mslt"][1:2]:
        assert p.comm.total < normal.comm.total / 2
        assert p.time.step_seconds < normal.time.step_seconds
    assert sum(p.time.seconds for _, p in runs["mslt"]) < normal.time.seconds


@pytest.mark.slow
def test_cli_prints_the_gpu_model_tables(capsys):
    """No data: a row a stage, a total a run against normal, the statement that it is a
    prediction at equal samples."""
    assert main(["model", "layerwise"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPU MODEL (a calibrated model's prediction, not a measurement)")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| run |")]
    stages = [r for r in rows if len(r) == 8]
    assert [(r[0], r[2]) for r in stages] == [
        ("normal", "24 (0)"), ("stacking", "6 (0)"), ("stacking", "12 (0)"),
        ("stacking", "24 (0)"), ("mslt", "8 (0)"), ("mslt", "16 (8)"), ("mslt", "24 (0)")]
    totals = {r[0]: r for r in rows if len(r) == 3}
    assert list(totals) == ["normal", "stacking", "mslt"] and totals["normal"][2] == "1.00"
    for name, stage_rows in (("stacking", stages[1:4]), ("mslt", stages[4:])):
        hours = sum(float(r[7]) for r in stage_rows)
        assert float(totals[name][1].split()[0]) == pytest.approx(hours, abs=0.003)
        assert float(totals[name][2]) < 1
    assert "a model's prediction at equal samples" in out
