"""model results: summarize on synthetic result logs (the olympic mean with a failed run, the
samples from train_samples and from the epoch_num fallbacks, the evals' seconds, a log without
run_stop), the command's CSV, and load_results on the real table and on bad ones. CPU only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bertperf.__main__ import main
from bertperf.errors import UserError
from bertperf.perfmodel import results


def write_log(path: Path, minutes: float, *, status: str = "success", samples=None,
              stop_epoch=None, evals: int = 3, interval: int = 150_000, marked: bool = True,
              run_stop: bool = True, gbs: int = 448) -> Path:
    """A result log: run_start at 0, `evals` evals `interval` samples apart (each 2 s between
    eval_start and eval_stop when marked), run_stop after `minutes`."""
    def line(key, t_ms, value=None, **meta):
        return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t_ms, "event_type": "POINT",
                                         "key": key, "value": value, "metadata": meta})

    t0 = 1_000_000
    lines = ["noise that is not a log line", line("submission_division", t0, "closed"),
             line("global_batch_size", t0, gbs), line("gradient_accumulation_steps", t0, 1),
             line("run_start", t0)]
    for i in range(1, evals + 1):
        t = t0 + i * 10_000
        if marked:
            lines.append(line("eval_start", t, None, epoch_num=i * interval))
            lines.append(line("eval_stop", t + 2_000, None, epoch_num=i * interval))
        lines.append(line("eval_accuracy", t + 2_000, 0.5 + i / 100, epoch_num=i * interval))
    end = t0 + round(minutes * 60_000)
    if samples is not None:
        lines.append(line("train_samples", end, samples))
    if run_stop:
        meta = {"status": status}
        if stop_epoch is not None:
            meta["epoch_num"] = stop_epoch
        lines.append(line("run_stop", end, None, **meta))
    path.write_text("\n".join(lines) + "\n")
    return path


def folder_of(tmp_path: Path, minutes: list[float], failed: tuple[int, ...] = (), **kw) -> Path:
    for i, m in enumerate(minutes):
        write_log(tmp_path / f"result_{i}.txt", m, samples=kw.pop("samples", 1_000_000 + i),
                  status="aborted" if i in failed else "success", **kw)
    return tmp_path


def test_olympic_mean_drops_fastest_and_slowest_and_counts_a_failed_run_as_slowest(tmp_path):
    folder = folder_of(tmp_path, [10, 20, 30, 40, 5], failed=(4,))
    s = results.summarize(folder)
    assert s["runs"] == 5 and s["converged"] == 4
    assert s["minutes"] == pytest.approx((20 + 30 + 40) / 3)     # 10 fastest, the failure slowest
    assert s["global_batch"] == 448 and s["accumulation"] == 1 and s["division"] == "closed"


def test_two_failed_runs_leave_no_time_and_too_few_runs_refused(tmp_path):
    folder = folder_of(tmp_path, [10, 20, 30, 40], failed=(0, 1))
    with pytest.raises(UserError, match="2 of its 4 runs did not converge"):
        results.summarize(folder)
    aborted = tmp_path / "aborted"
    aborted.mkdir()
    folder_of(aborted, [10, 20, 30], failed=(0, 1, 2))
    with pytest.raises(UserError, match="3 of its 3 runs did not converge"):
        results.summarize(aborted)
    few = tmp_path / "few"
    few.mkdir()
    folder_of(few, [10, 20])
    with pytest.raises(UserError, match=r"few: 2 result_\*\.txt logs"):
        results.summarize(few)


def test_samples_from_train_samples_then_run_stop_then_the_last_eval(tmp_path):
    for i, m in enumerate([10, 11, 12]):
        write_log(tmp_path / f"result_{i}.txt", m, samples=3_000_000, stop_epoch=1)
    assert results.summarize(tmp_path)["samples"] == 3_000_000
    for i, m in enumerate([10, 11, 12]):
        write_log(tmp_path / f"result_{i}.txt", m, stop_epoch=2_000_000 + i)
    assert results.summarize(tmp_path)["samples"] == pytest.approx(2_000_001)
    for i, m in enumerate([10, 11, 12]):
        write_log(tmp_path / f"result_{i}.txt", m, evals=4, interval=100_000)
    assert results.summarize(tmp_path)["samples"] == 400_000


def test_samples_are_the_mean_of_the_converged_runs_only(tmp_path):
    for i, (m, n) in enumerate([(10, 100), (11, 200), (12, 300), (13, 999)]):
        write_log(tmp_path / f"result_{i}.txt", m, samples=n, status="success" if i < 3 else "x")
    assert results.summarize(tmp_path)["samples"] == 200


def test_eval_seconds_evals_and_interval_and_unmarked_logs(tmp_path):
    folder = folder_of(tmp_path, [10, 11, 12], evals=5, interval=175_000)
    s = results.summarize(folder)
    assert s["eval_seconds"] == pytest.approx(10.0) and s["eval_marked"]
    assert s["evals"] == 5 and s["eval_interval"] == 175_000
    unmarked = tmp_path / "unmarked"
    unmarked.mkdir()
    s = results.summarize(folder_of(unmarked, [10, 11, 12], evals=4, marked=False))
    assert s["eval_seconds"] == 0 and not s["eval_marked"] and s["evals"] == 4
    assert results.format_summary(s)[5] == ""       # empty: not in the logs


def test_a_log_without_run_stop_or_without_events_names_the_file(tmp_path):
    folder_of(tmp_path, [10, 11])
    write_log(tmp_path / "result_2.txt", 12, samples=1, run_stop=False)
    with pytest.raises(UserError, match=r"result_2\.txt: no run_stop event"):
        results.summarize(tmp_path)
    (tmp_path / "result_2.txt").write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(UserError, match=r"result_2\.txt: no :::MLLOG lines"):
        results.summarize(tmp_path)


def test_command_prints_a_csv_line_a_folder_and_one_line_errors(tmp_path, capsys):
    folder = folder_of(tmp_path, [10, 20, 30])
    assert main(["model", "results", str(folder)]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header.split(",") == ["folder", *results.FIELDS]
    assert row.split(",")[1:] == ["closed", "3", "3", "1000001", "20.000", "6.0", "3.0",
                                  "150000", "448", "1"]
    with pytest.raises(UserError, match="nothing: no such folder"):
        results.summarize(tmp_path / "nothing")
    with pytest.raises(UserError, match="result_0.txt: is a file, not a result folder"):
        results.summarize(folder / "result_0.txt")
    (tmp_path / "nothing").mkdir()  # a good folder, then a bad one: one line, no CSV at all
    assert main(["model", "results", str(folder), str(tmp_path / "nothing")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.strip().endswith("an olympic mean needs 3 or more")


def test_the_table_loads_and_each_row_names_its_source_and_config():
    table = results.load_results()
    assert len(table) >= 30
    for r in table:
        assert r.source.startswith(f"mlcommons/training_results_{r.round}@")
        assert r.source.endswith(f":{r.organization}/results/{r.system}/bert")
        assert r.config.startswith(f"{r.organization}/") and r.config.endswith(".sh")
        assert r.precision == ("fp16" if r.gpu.startswith("A100") else r.precision)
    rounds = {r.round for r in table}
    assert rounds == {"v1.0", "v1.1", "v2.0", "v2.1", "v3.0", "v3.1", "v4.0", "v4.1", "v5.0"}
    assert {r.gpu.split()[0] for r in table} >= {"A100", "H100", "H200", "B200", "GB200"}
    nvidia = {(r.round, r.gpus) for r in table if r.organization.startswith("NVIDIA")}
    assert {("v2.0", 8), ("v2.0", 64), ("v2.0", 1024), ("v2.0", 4096), ("v3.0", 8),
            ("v3.0", 3072), ("v3.1", 3472), ("v4.0", 8), ("v5.0", 8), ("v5.0", 512)} <= nvidia
    one = next(r for r in table if r.round == "v2.0" and r.organization == "NVIDIA"
               and r.nodes == 1)
    assert (one.minutes, one.samples, one.global_batch) == (18.442, 2_643_110, 448)
    packed = next(r for r in table if r.packed)
    assert packed.gpus * packed.batch * packed.packing_factor == packed.global_batch


@pytest.mark.parametrize("column, text, message", [
    ("gpu", "A100", "line 2: gpu 'A100' is not a GPU like A100 80GB SXM"),
    ("runs", "2", "line 2: runs '2' is not a whole number >= 3"),
    ("packed", "maybe", "line 2: packed 'maybe' is not yes or no"),
    ("source", "somewhere", "line 2: source 'somewhere' is not mlcommons"),
    ("global_batch", "449", ("line 2: nodes x gpus_per_node x batch x accumulation x "
                             "packing_factor = 448, not global_batch 449")),
    ("converged", "8", "line 2: 8 of 10 runs converged"),
    ("system", "other", "line 2: source .* is not v2.0's NVIDIA/results/other"),
])
def test_bad_tables_name_the_line_and_column(tmp_path, column, text, message):
    lines = results.RESULTS.read_text().splitlines()
    names = lines[0].split(",")
    row = next(l for l in lines[1:] if l.startswith("v2.0,NVIDIA,dgxa100_ngc22.04")).split(",")
    row[names.index(column)] = text
    table = tmp_path / "results.csv"
    table.write_text("\n".join([lines[0], ",".join(row)]) + "\n")
    with pytest.raises(UserError, match=message):
        results.load_results(table)
    table.write_text("round,organization\n")
    with pytest.raises(UserError, match="line 1 must name the columns"):
        results.load_results(table)
    table.write_text(lines[0] + "\nv2.0,NVIDIA\n")
    with pytest.raises(UserError, match="line 2 has 2 cells, not 28"):
        results.load_results(table)
