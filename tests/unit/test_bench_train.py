"""`bench train`: it runs, its table is well formed, every row trains on the same sequences,
every bertperf row runs the trainer's build_step and train_step with its switches as settings.
Speed is what the benchmark measures; nothing here times it."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from bertperf.model import BertConfig
from tests.support.spy import spy


def test_help_starts_without_torch():
    code = ("import sys\nfrom bertperf.__main__ import build_parser\n"
            "try:\n    build_parser(['bench', 'train', '--help']).parse_args(['bench', 'train', "
            "'--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("flag, value, least", [
    ("--batch", "0", 1), ("--steps", "0", 1), ("--layers", "0", 1), ("--warmup", "-1", 0)])
def test_sizes_below_their_least_are_one_line_before_anything_runs(monkeypatch, capsys, flag,
                                                                    value, least):
    """0 is a value, not "unset": it is refused, not replaced by the default (which ran a whole
    benchmark)."""
    from bertperf.__main__ import main
    from bertperf.bench import train
    monkeypatch.setattr(train, "load_steps", lambda *args: pytest.fail("the benchmark ran"))
    assert main(["bench", "train", "--synthetic", flag, value]) == 1
    assert capsys.readouterr().err == \
        f"bertperf: error: {flag} must be at least {least}, got {value}\n"


def small_bench(tmp_path, packed: bool):
    """Two steps of two rows of real shards (written by data.synthetic) for a 1-layer tiny
    BERT."""
    import argparse

    from bertperf.bench import train
    from bertperf.data import synthetic
    from bertperf.model import BertForPreTraining

    folder = tmp_path / ("packed" if packed else "unpadded")
    write = synthetic.write_synthetic_packed if packed else synthetic.write_synthetic_shards
    write(folder, 2, 16, seed=3, max_seq_length=64, max_pred=10)
    args = argparse.Namespace(synthetic=False, data=folder, batch=2, seed=1)
    steps, _, max_len, max_pred = train.load_steps(args, 2)
    config = replace(BertConfig.named("tiny"), num_hidden_layers=1)
    initial = BertForPreTraining(config).state_dict()
    return train.Bench(config, torch.device("cpu"), steps, 1, max_len, max_pred, initial)


def test_a_report_it_cannot_append_to_is_one_line_before_anything_runs(monkeypatch, capsys,
                                                                       tmp_path):
    from bertperf.__main__ import main
    from bertperf.bench import train
    monkeypatch.setattr(train, "load_steps", lambda *args: pytest.fail("the benchmark ran"))
    (tmp_path / "a_file").write_text("")
    for report, why in [(tmp_path, "is a folder, expected a file to append to"),
                        (tmp_path / "a_file" / "r.md",
                         f"cannot be written: {tmp_path / 'a_file'} is a file, not a folder")]:
        assert main(["bench", "train", "--synthetic", "--report", str(report)]) == 1
        assert capsys.readouterr().err == f"bertperf: error: --report {report}: {why}\n"


@pytest.mark.parametrize("packed", [False, True], ids=["unpadded", "packed"])
def test_rows_train_on_the_same_sequences(tmp_path, packed):
    """HF's padded batches and the trainer's unpadded (or packed) micro-batches hold the same
    sequences, step by step; packed shards give steps of whole rows; before any step and
    without dropout both models give the same (mean) losses."""
    from bertperf.bench import train

    bench = small_bench(tmp_path, packed)
    assert len(bench.steps) == 2
    for step in bench.steps:
        assert (step.rows is not None) == packed
        if packed:
            assert len(step.rows) == 2 and step.rows.sum() == len(step.samples)
        else:
            assert len(step.samples) == 2
    from bertperf.model import forward_loss

    hf = train.hf_row(bench, "fp32")
    hf.model.eval()
    for layout in ["varlen", "packed"] if packed else ["varlen"]:
        ours = train.bertperf_row(bench, train.run_config((layout,), "cpu"))
        assert hf.digests == ours.digests and len(set(hf.digests)) == 2
        ours.model.eval()
        with torch.no_grad():
            for a, micro in zip(hf.batches, ours.batches):
                torch.testing.assert_close(
                    hf.model(**a).loss,
                    forward_loss(ours.model, micro.inputs, micro.counts).float(),
                    rtol=1e-5, atol=1e-5)


def test_every_bertperf_row_runs_the_trainers_step(tmp_path, monkeypatch):
    """Each bertperf row builds its step with train.loop.build_step from a RunConfig carrying
    its switches as the trainer's settings (PRECISION, LAYOUT; FUSED_KERNELS=0 before the
    fused-kernels switch and 1 from it on; COMPILE=inductor; USE_CUDA_GRAPH=1) and the bench's
    LAMB, on one process and the bench's device, from the bench's weights; every step it times
    is train.loop.train_step on that step and one MicroBatch (stubbed here: the CLI test and
    the test above run it)."""
    from bertperf.bench import train
    from bertperf.train import loop
    from bertperf.train.dist import Dist

    assert [(c.train.precision, c.data.layout, c.train.fused_kernels, c.train.compile,
             c.train.use_cuda_graph, c.train.fp8) for c in (train.run_config(s, "cpu") for s in (
                 ("varlen",), ("varlen", "bf16"), ("varlen", "bf16", "packed"),
                 ("varlen", "bf16", "packed", "fused kernels"),
                 ("varlen", "bf16", "packed", "fused kernels", "compile"),
                 ("varlen", "bf16", "packed", "fused kernels", "compile", "CUDA graphs"),
                 train.SWITCHES))] == [
        ("fp32", "varlen", False, "none", False, "0"),
        ("bf16", "varlen", False, "none", False, "0"),
        ("bf16", "packed", False, "none", False, "0"), ("bf16", "packed", True, "none", False, "0"),
        ("bf16", "packed", True, "inductor", False, "0"),
        ("bf16", "packed", True, "inductor", True, "0"),
        ("bf16", "packed", True, "inductor", True, "1")]
    bench = small_bench(tmp_path, packed=True)
    built = spy(monkeypatch, loop, "build_step")
    stepped = []
    monkeypatch.setattr(loop, "train_step", lambda step, micro: stepped.append((step, micro))
                        or torch.zeros((), dtype=torch.float64))
    ran = {}
    for label, precision, build in train.rows(bench, ("fp32",)):
        if label.startswith("bertperf") and train.measure(bench, label, precision,
                                                          build).missing is None:
            (cfg, dist, device, core), _ = built[-1]
            assert dist == Dist(0, 1) and device == bench.device
            assert all(torch.equal(v, bench.initial[k]) for k, v in core.state_dict().items())
            assert (cfg.optim.lr, cfg.optim.max_steps, cfg.optim.max_grad_norm) == \
                (train.LR, train.MAX_STEPS, train.MAX_GRAD_NORM)
            timed = stepped[-len(bench.steps):]
            assert all(step.cfg is cfg and step.plan.core is core and len(micro) == 1
                       and isinstance(micro[0], loop.MicroBatch) for step, micro in timed)
            ran[label] = (cfg.data.layout, cfg.train.fused_kernels, cfg.train.compile,
                          cfg.train.use_cuda_graph)
    # on this CPU the fused kernels and CUDA graphs are not available, and left out after
    assert ran == {"bertperf: varlen": ("varlen", False, "none", False),
                   "bertperf: + packed": ("packed", False, "none", False),
                   "bertperf: + compile": ("packed", False, "inductor", False)}
    assert len(stepped) == 3 * len(bench.steps)


def test_rows_the_trainer_refuses_say_why_in_its_words(tmp_path):
    """A switch the trainer refuses for the row's configuration is "not available" with the
    line of the row of train.allowed.REFUSED that fires (of the settings and this machine) and
    is left out of the rows after; what the data lacks is the bench's to say."""
    from bertperf.bench import train
    from bertperf.train import allowed

    bench = small_bench(tmp_path, packed=False)
    why = dict((label, build) for label, _, build in train.rows(bench, ("fp32",)))

    def reason(label):
        with pytest.raises(train.NotAvailable) as exc:
            why[label]()
        return str(exc.value)

    def refused(switches):
        facts = allowed.Facts(train.run_config(switches, "cpu"))
        row = allowed.refusal(facts, (allowed.SETTINGS, allowed.MACHINE))
        return row.name, row.why(facts)

    assert reason("bertperf: + packed") == "needs packed shards: prep pack"
    for label, switches, row in [
            ("bertperf: + compile", ("varlen", "compile"), "compile_without_fixed_shapes"),
            ("bertperf: + fused kernels", ("varlen", "fused kernels"), "fused_kernels_on_cpu"),
            ("bertperf: + FP8", ("varlen", "FP8"), "fp8_without_bf16")]:  # fp32 rows: bf16 first
        assert refused(switches) == (row, reason(label))
    if not torch.cuda.is_available():
        assert refused(("varlen", "bf16", "FP8"))[0] == "fp8_without_fp8_gpu"


def lambs_of(line: str) -> dict[str, list[str]]:
    """The LAMB line read back: {each LAMB class: the rows that stepped it, in order}."""
    lambs = {}
    for part in line.removeprefix("LAMB: ").split("; "):
        described, rows = part.rsplit(" in ", 1)
        lambs[described.split()[0]] = rows.split(", ")
    return lambs


def test_the_optimizer_line_names_each_rows_lamb(capsys):
    """One line: each LAMB class with the rows that ran with it, in the rows' order; a row that
    did not run (missing) is not named."""
    from bertperf.bench import train

    results = [train.Result("HF", "fp32", optimizer="Lamb"),
               train.Result("bertperf: varlen", "fp32", optimizer="Lamb"),
               train.Result("bertperf: + packed", "fp32", optimizer="Lamb",
                            missing="not available (x)"),
               train.Result("bertperf: + fused kernels", "bf16", optimizer="FlatLamb")]
    train.print_optimizers(results)
    (line,) = capsys.readouterr().out.splitlines()
    assert lambs_of(line) == {"Lamb": ["HF", "bertperf: varlen"],
                              "FlatLamb": ["bertperf: + fused kernels"]}


@pytest.mark.slow
def test_bench_train_prints_its_table(tmp_path):
    """The command on synthetic samples with a tiny model: one table of rows (every bertperf
    switch either measured or 'not available (why)'), the same-samples line, no prediction (that
    is `model step`'s), and the report file. In fp32 and without the `+ compile` row: its
    inductor compile on a cold cache (a fresh machine's) took 90 of the test's 97 seconds, and
    the bf16 rows would add half as much again (both rows' settings:
    test_every_bertperf_row_runs_the_trainers_step; a compiled step's graphs:
    tests/unit/test_warmup.py, with aot_eager)."""
    report = tmp_path / "report.md"
    run = subprocess.run([sys.executable, "-m", "bertperf", "bench", "train", "--synthetic",  # noqa: PLW1510
                          "--config", "tiny", "--batch", "2", "--warmup", "1", "--steps", "1",
                          "--precision", "fp32", "--rows", "hf,varlen,packed,kernels,graphs,fp8",
                          "--report", str(report)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| ") and " | " in line]
    header = rows.index(next(r for r in rows if r.startswith("| row |")))
    table = rows[header + 1:header + 7]
    assert [r.split(" | ")[0] for r in table] == [
        "| HF BertForPreTraining (SDPA, padded)", "| bertperf: varlen", "| bertperf: + packed",
        "| bertperf: + fused kernels", "| bertperf: + CUDA graphs", "| bertperf: + FP8"]
    losses = []
    for r in table:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert len(cells) == 9, r
        if cells[2].startswith("not available ("):
            continue
        assert float(cells[2].replace(",", "")) > 0 and cells[5].endswith("%"), r
        losses.append(float(cells[7]))
    assert len(losses) >= 3 and max(losses) - min(losses) < 0.1 * min(losses)
    assert "| bertperf: + CUDA graphs | fp32 | not available " \
        "(USE_CUDA_GRAPH=1 needs a CUDA device, not DEVICE=cpu)" in run.stdout
    # FP8: refused in the trainer's own words
    assert "| bertperf: + FP8 | fp32 | not available (FP8=1 runs the encoder's GEMMs in FP8 " \
        "around bf16 activations" in run.stdout
    assert any(line.startswith("every row trained on the same 4 sequences") for line in lines)
    # on this CPU every row steps Lamb (FlatLamb where the kernels take Triton: CUDA)
    assert "LAMB: Lamb (per tensor, foreach ops) in HF BertForPreTraining (SDPA, padded), " \
        "bertperf: varlen, bertperf: + packed" in run.stdout
    assert not any(line.startswith(("| A100", "| H100")) for line in lines)
    assert report.read_text().count("| bertperf: varlen |") == 1


FAST = ["bench", "train", "--synthetic", "--config", "tiny", "--layers", "1", "--batch", "2",
        "--warmup", "0", "--steps", "1", "--precision", "fp32"]
"""The command at its smallest: one timed step of 2 synthetic rows, a 1-layer tiny BERT, fp32."""


def table_of(out: str) -> list[list[str]]:
    """The measured table read back: each row's cells."""
    lines = out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("| row |")))
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in itertools.takewhile(lambda line: line.startswith("| "),
                                            lines[header + 2:])]


def wrap_rows(monkeypatch, wrap) -> None:
    """train.rows as the command calls it, each row's build replaced by wrap(label, build)."""
    from bertperf.bench import train

    real = train.rows

    def rows(*args):
        for label, precision, build in real(*args):
            yield label, precision, wrap(label, build)

    monkeypatch.setattr(train, "rows", rows)


def test_each_row_is_printed_and_reported_as_soon_as_it_is_measured(tmp_path, monkeypatch,
                                                                    capsys):
    """The table's header comes before the first row is built, each row's line (with its speed
    against the HF row before it) before the next row is built, on stdout and in --report's
    file alike, so that a run stopped at a time limit keeps the rows measured; --rows measures
    and prints only the rows it names."""
    from bertperf.__main__ import main

    report = tmp_path / "report.md"
    before = []  # (stdout since the row before was built, the report) as each row is built

    def recording(label, build):
        def build_after_recording():
            before.append((capsys.readouterr().out, report.read_text()))
            return build()
        return build_after_recording

    wrap_rows(monkeypatch, recording)
    assert main([*FAST, "--rows", "hf,varlen,packed", "--report", str(report)]) == 0
    out = "".join(o for o, _ in before) + capsys.readouterr().out
    table = table_of(out)
    assert [cells[0] for cells in table] == ["HF BertForPreTraining (SDPA, padded)",
                                             "bertperf: varlen", "bertperf: + packed"]
    assert all(float(cells[2].replace(",", "")) > 0 for cells in table)
    assert table[0][8] == "1.00x" and all(cells[8].endswith("x") for cells in table)
    lines = out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("| row |")))
    done = lines[header + 1:header + 4]  # the separator, HF's line, varlen's
    assert [o for o, _ in before[1:]] == [line + "\n" for line in done[1:]]
    for (o, text), line in zip(before, done, strict=True):
        assert o.endswith(line + "\n") and text.endswith(line + "\n")
    assert before[0][1].startswith("`python -m bertperf")  # the command (pytest's own argv here)
    assert any(line.startswith("every row trained on the same") for line in out.splitlines())
    assert report.read_text().count("| bertperf: + packed |") == 1


def test_a_failing_row_is_one_cell_freed_and_the_rows_after_run(monkeypatch, capsys):
    """A row whose build raises (here HF's, a ValueError after its model is built) is that
    row's "failed (type: first line)" cell; its model is freed before the next row is built;
    the rows after it are measured, with no HF row of their precision to compare with."""
    import weakref

    from bertperf.__main__ import main

    models, freed = [], []

    def failing_hf(label, build):
        def build_or_fail():
            freed.extend(model() is None for model in models)
            if not label.startswith("HF"):
                return build()
            t = build()
            models.append(weakref.ref(t.model))
            raise ValueError("injected after the model was built\nsecond line")
        return build_or_fail

    wrap_rows(monkeypatch, failing_hf)
    assert main([*FAST, "--rows", "hf,varlen,packed"]) == 0
    out = capsys.readouterr().out
    hf, *after = table_of(out)
    assert hf[2:] == ["failed (ValueError: injected after the model was built)"] + [""] * 6
    assert freed == [True, True]
    assert [cells[0] for cells in after] == ["bertperf: varlen", "bertperf: + packed"]
    assert all(float(cells[2].replace(",", "")) > 0 and cells[8] == "" for cells in after)
    (line,) = [line for line in out.splitlines() if line.startswith("LAMB: ")]
    assert lambs_of(line) == {"Lamb": ["bertperf: varlen", "bertperf: + packed"]}
    assert any(line.startswith("every row trained on the same") for line in out.splitlines())


def test_rows_selects_rows_with_the_switches_of_those_before(tmp_path, monkeypatch, capsys):
    """--rows' keys name the rows built; a bertperf row left out still adds its switch to the
    rows after it (where available); an unknown key is one line naming it and the keys, before
    anything is measured."""
    from bertperf.__main__ import main
    from bertperf.bench import train
    from bertperf.train import loop

    bench = small_bench(tmp_path, packed=True)
    def labels(*keys):
        return [label for label, _, _ in train.rows(bench, ("fp32",), *keys)]

    assert labels({"hf"}) == ["HF BertForPreTraining (SDPA, padded)"]
    assert labels(set(train.ROW_KEYS)) == labels()
    (label, precision, build), fp8 = train.rows(bench, ("fp32",), {"compile", "fp8"})
    assert (label, precision, fp8[0]) == ("bertperf: + compile", "fp32", "bertperf: + FP8")
    built = spy(monkeypatch, loop, "build_step")
    build()
    (cfg, _, _, _), _ = built[-1]
    # packed on before it; the fused kernels not available on this CPU
    assert cfg == train.run_config(("varlen", "packed", "compile"), "cpu")
    with pytest.raises(train.NotAvailable):  # FP8=1 needs PRECISION=bf16
        fp8[2]()

    assert main([*FAST, "--rows", "hf, cuda,fp8"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == ("bertperf: error: --rows: no row 'cuda'; the rows: hf, varlen, "
                                 "bf16, packed, kernels, compile, graphs, fp8\n")
