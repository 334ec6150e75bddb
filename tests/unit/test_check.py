"""bertperf check / submission, fast: the output parsers on real checker outputs, and the pieces
of the submission builder that need no training run.

The *_OUT constants below are excerpts (a subset of lines, verbatim; long RCP records cut at
'Hyperparams', tracebacks shortened, paths shortened) of what mlperf-logging 4.1.68's tools printed
(stdout and stderr merged, as bertperf.mlperf.check.run_tool reads them) when run on real tiny
training logs of `python -m bertperf train` and on copies of them broken on purpose, 2026-11-22.
Each is (exit status, output); the summarizer's also carries the rows of the JSON it wrote.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertperf.errors import UserError
from bertperf.mlperf import check as C  # noqa: N812
from bertperf.mlperf.check import BYPASS, FAIL, PASS, WARN, Result
from tests.support.cli import cli
from tests.support.paths import ROOT

# ---- captured outputs ----------------------------------------------------------------------------

CC_DUP = (0, '''\
INFO - Running compliance on file: cap/dup_run_start.txt
INFO -  Compliance checks: training_5.0.0/common.yaml
WARNING -  Required EXACTLY_ONE occurrence of 'run_start' but found 2
** Logging output also at /tmp/x/cap2/x.log
INFO - SUCCESS
''')

CC_JSON = (1, '''\
INFO - Running compliance on file: bad_json.txt
WARNING -  Found parsing errors:
WARNING -   :::MLLOG {"key": "x"
WARNING -    ^^  Expecting ',' delimiter: line 1 column 12 (char 11)
INFO -  Compliance checks: training_5.0.0/common.yaml
WARNING -  Log lines had parsing errors.
ERROR - FAILED
** Logging output also at /tmp/x/cap2/x.log
''')

CC_LOWACC = (1, '''\
INFO - Running compliance on file: cap/low_acc.txt
INFO -  Compliance checks: training_5.0.0/common.yaml
WARNING -  Failed checks for eval_accuracy : (v['value'] >= 0.720) and v['value'] < 1.0
ERROR - FAILED
** Logging output also at /tmp/x/cap2/x.log
''')

CC_NOMETA = (1, '''\
INFO - Running compliance on file: cap/no_meta.txt
Traceback (most recent call last):
  ...
                                           ~^^^^^^^^^^^^
KeyError: 'metadata'
''')

CC_NOSTOP = (1, '''\
INFO - Running compliance on file: bad_nostop.txt
INFO -  Compliance checks: training_5.0.0/common.yaml
WARNING -  Required EXACTLY_ONE occurrence of 'run_stop' but found 0
ERROR - FAILED
** Logging output also at /tmp/x/cap2/x.log
''')

CC_PASS = (0, '''\
INFO - Running compliance on file: runs/s1/result_0.txt
INFO -  Compliance checks: training_5.0.0/common.yaml
** Logging output also at /tmp/x/cap2/x.log
INFO - SUCCESS
''')

PC_BYPASS = (0, '''\
INFO -  Checking System Description Files
INFO -   System description checker passed for sys1
INFO - ------------------------------
INFO -  Running compliance checks in dir pkg/Org/results/sys1/bert
INFO -  System sys1
INFO -  Benchmark bert
INFO - ------------------------------
INFO - Running compliance on file: pkg/Org/results/sys1/bert/result_0.txt
INFO -  Compliance checks: training_5.0.0/common.yaml
INFO - ------------------------------
INFO -  Running Seed Checker
INFO - ------------------------------
INFO -  Running RCP Checker, pass: pruned_rcps
INFO - ------------------------------
INFO -  RCP Record: {'Benchmark': 'bert', 'BS': 448, ...}
INFO -  Submission mean epochs: 2680.0000
WARNING -  RCP test failed but allowed to proceed with RCP bypass.
WARNING -  Please be ready to have this reviewed by the submission committee.
INFO - RCP Test Passed: Missing RCP, please submit RCP with BS = 16 passed using rcp_bypass
INFO - ------------------------------
INFO - PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !
INFO - ------------------------------

** Detailed log output is also at /tmp/x/cap2/x.log
''')

PC_MANY = (0, '''\
INFO -  Checking System Description Files
INFO -   System description checker passed for sys1
INFO - ------------------------------
INFO -  Running compliance checks in dir pkgb/Org/results/sys1/bert
INFO -  System sys1
INFO -  Benchmark bert
INFO - ------------------------------
ERROR - Incorrect number of files in dir, or wrong file names in directory pkgb/Org/results/sys1/bert, found 9, expected 10
INFO - ------------------------------
INFO - Running compliance on file: pkgb/Org/results/sys1/bert/result_0.txt
INFO -  Compliance checks: training_5.0.0/common.yaml
INFO - ------------------------------
WARNING -  Found parsing errors:
WARNING -   :::MLLOG {"key": "x"
WARNING -    ^^  Expecting ',' delimiter: line 1 column 12 (char 11)
WARNING -  Log lines had parsing errors.
INFO - ------------------------------
WARNING -  Required EXACTLY_ONE occurrence of 'run_stop' but found 0
ERROR -  2 files do not comply, directory cannot be accepted
INFO - ------------------------------
INFO -  Running Seed Checker
ERROR -  Seed checker failed and found the following errors: Result file pkgb/Org/results/sys1/bert/result_6.txt logs seed 1 on /repo/implementations/pytorch/bertperf/train/loop.py:127. However, result file pkgb/Org/results/sys1/bert/result_0.txt already logs the same seed on the same line.
Error found when querying seeds from pkgb/Org/results/sys1/bert/result_7.txt: Found parsing errors:
:::MLLOG {"key": "x"
  ^^  Expecting ',' delimiter: line 1 column 12 (char 11)

Log lines had parsing errors.
Result file pkgb/Org/results/sys1/bert/result_8.txt logs seed 1 on /repo/implementations/pytorch/bertperf/train/loop.py:127. However, result file pkgb/Org/results/sys1/bert/result_0.txt already logs the same seed on the same line.
ERROR - Seed checker failed
INFO - ------------------------------
INFO -  Running RCP Checker, pass: pruned_rcps
INFO - ------------------------------
WARNING -  Run incomplete or did not converge. Marking as infinite.
INFO -  RCP Record: {'Benchmark': 'bert', 'BS': 448, ...}
INFO -  Submission mean epochs: 2651.4286
WARNING -  RCP test failed but allowed to proceed with RCP bypass.
WARNING -  Please be ready to have this reviewed by the submission committee.
INFO - RCP Test Passed: Missing RCP, please submit RCP with BS = 16 passed using rcp_bypass
INFO - ------------------------------
INFO - PACKAGE CHECKER FOUND ERRORS, LOOK INTO ERROR LOG LINES AND FIX THEM.
INFO - ------------------------------

** Detailed log output is also at /tmp/x/cap2/x.log
''')

PC_MISSING = (0, '''\
INFO -  Checking System Description Files
INFO -   System description checker passed for sys1
INFO - ------------------------------
INFO -  Running compliance checks in dir pkg/Org/results/sys1/bert
INFO -  System sys1
INFO -  Benchmark bert
INFO - ------------------------------
INFO - Running compliance on file: pkg/Org/results/sys1/bert/result_0.txt
INFO -  Compliance checks: training_5.0.0/common.yaml
INFO - ------------------------------
INFO -  Running Seed Checker
INFO - ------------------------------
INFO -  Running RCP Checker, pass: pruned_rcps
INFO - ------------------------------
INFO -  RCP Record: {'Benchmark': 'bert', 'BS': 448, ...}
INFO -  Submission mean epochs: 2680.0000
ERROR - RCP Test Failed: Missing RCP, please submit RCP with BS = 16
INFO - ------------------------------
INFO - PACKAGE CHECKER FOUND ERRORS, LOOK INTO ERROR LOG LINES AND FIX THEM.
INFO - ------------------------------

** Detailed log output is also at /tmp/x/cap2/x.log
''')

PC_SCALE = (0, '''\
INFO -  Checking System Description Files
INFO -   System description checker passed for sys1
INFO - ------------------------------
INFO -  Running compliance checks in dir pk448/Org/results/sys1/bert
INFO -  System sys1
INFO -  Benchmark bert
INFO - ------------------------------
WARNING - Detected 11 total files in directory pk448/Org/results/sys1/bert, but some do not conform to naming convention, should you rename them to result_*.txt ?
WARNING - Unknown files in result directory: pk448/Org/results/sys1/bert
INFO - ------------------------------
INFO - Running compliance on file: pk448/Org/results/sys1/bert/result_0.txt
INFO -  Compliance checks: training_5.0.0/common.yaml
INFO - ------------------------------
INFO -  Running Seed Checker
INFO - ------------------------------
INFO -  Running RCP Checker, pass: pruned_rcps
INFO - ------------------------------
INFO -  RCP Record: {'Benchmark': 'bert', 'BS': 448, ...}
INFO -  Submission mean epochs: 2330000.0000
INFO -  Submission mean epochs faster than RCP mean but within max speedup range. Score should be normalized by factor of 2414421.3333333335 / 2330000.0 = 1.0362323319027182
INFO -  Results scaling set to normalization factor of 1.0362
INFO - RCP Test Passed: RCP found
INFO - ------------------------------
INFO - PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !
INFO - ------------------------------

** Detailed log output is also at /tmp/x/cap2/x.log
''')

RCP_EMPTY = (1, '''\
INFO - ------------------------------
INFO -  Running RCP Checker, pass: pruned_rcps
INFO - ------------------------------
Traceback (most recent call last):
  ...
                           ~~~~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^
KeyError: None
''')

RCP_FOUND = (0, '''\
INFO - ------------------------------
INFO -  Running RCP Checker, pass: pruned_rcps
INFO - ------------------------------
INFO -  RCP Record: {'Benchmark': 'bert', 'BS': 448, ...}
INFO -  Submission mean epochs: 2440000.0000
INFO - RCP found, RCP test PASSED
** Logging output also at /tmp/x/cap2/x.log
''')

RCP_MISSING = (1, '''\
INFO - ------------------------------
INFO -  Running RCP Checker, pass: pruned_rcps
INFO - ------------------------------
INFO -  RCP Record: {'Benchmark': 'bert', 'BS': 448, ...}
INFO -  Submission mean epochs: 2680.0000
ERROR - Missing RCP, please submit RCP with BS = 16, RCP test FAILED, consider adding --rcp_bypass in when running the package_checker.
** Logging output also at /tmp/x/cap2/x.log
''')

RCP_SCALE = (0, '''\
INFO - ------------------------------
INFO -  Running RCP Checker, pass: pruned_rcps
INFO - ------------------------------
INFO -  RCP Record: {'Benchmark': 'bert', 'BS': 448, ...}
INFO -  Submission mean epochs: 2330000.0000
INFO -  Submission mean epochs faster than RCP mean but within max speedup range. Score should be normalized by factor of 2414421.3333333335 / 2330000.0 = 1.0362323319027182
INFO - RCP found, RCP test PASSED
** Logging output also at /tmp/x/cap2/x.log
''')

SD_BADJSON = (1, '''\
Traceback (most recent call last):
  ...
               ^^^^^^^^^^^^^^^^^^^^^^
json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
''')

SD_MISSING = (0, '''\
ERROR -   System description checker failed for sys1 : ['Missing field cooling', 'Missing field sw_notes']
** Logging output also at /tmp/x/cap2/x.log
''')

SD_PASS = (0, '''\
INFO -   System description checker passed for sys1
** Logging output also at /tmp/x/cap2/x.log
''')

SD_STATUS = (0, '''\
ERROR -   System description checker failed for sys1 : ["Field status contains a non valid value: onprem, must be one of ['Available on-premise', 'Available cloud', 'Research, Development, or Internal (RDI)', 'Preview']"]
** Logging output also at /tmp/x/cap2/x.log
''')

CC_BLOCK = (1, '''\
INFO - Running compliance on file: cap/early_block.txt
INFO -  Compliance checks: training_5.0.0/common.yaml
WARNING -  CHECK for 'block_start' failed in line 2:
:::MLLOG {"namespace": "", "time_ms": 1795334163436, "event_type": "INTERVAL_START", "key": "block_start", "value": null, "metadata": {"file": "/repo/implementations/pytorch/bertperf/train/loop.py", "lineno": 190, "first_epoch_num": 0, "epoch_count": 1, "samples_count": 0}}
failed test: s['run_started']
current context[s]={
  "run_started": false,
  "run_stopped": false
}
ERROR - FAILED
** Logging output also at /tmp/x/cap2/x.log
''')

PC_ONE_TOLERATED = (0, '''\
INFO -  Checking System Description Files
INFO -   System description checker passed for sys1
INFO - ------------------------------
INFO -  Running compliance checks in dir pkgd/Org/results/sys1/bert
INFO -  System sys1
INFO -  Benchmark bert
INFO - ------------------------------
INFO - Running compliance on file: pkgd/Org/results/sys1/bert/result_3.txt
WARNING -  Required EXACTLY_ONE occurrence of 'run_stop' but found 0
INFO - ------------------------------
INFO - Running compliance on file: pkgd/Org/results/sys1/bert/result_9.txt
WARNING -  1 file does not comply, accepting this under olympic scoring
INFO - ------------------------------
INFO -  Running Seed Checker
INFO - ------------------------------
INFO -  Running RCP Checker, pass: pruned_rcps
INFO - ------------------------------
WARNING -  Run incomplete or did not converge. Marking as infinite.
INFO -  Submission mean epochs: 2680.0000
WARNING -  RCP test failed but allowed to proceed with RCP bypass.
WARNING -  Please be ready to have this reviewed by the submission committee.
INFO - RCP Test Passed: Missing RCP, please submit RCP with BS = 16 passed using rcp_bypass
INFO - ------------------------------
INFO - PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !
INFO - ------------------------------

** Detailed log output is also at /tmp/x/x.log
''')

# result_summarizer: its merged stdout/stderr, and the rows of the detailed JSON it writes
SUM_MISSING = (0, '''\
ERROR: RCP Test Failed on Org/sys1/bert with message: Missing RCP, please submit RCP with BS = 16.
Strong Scaling Scores:
Strong Scaling Scores:
''', [{"submitter": "Org", "system": "sys1", "bert:time_to_train": 0.0548958333, "bert:GBS": 16.0,
        "bert:samples_to_converge": 2680.0, "bert:RCP": "Missing", "bert:rcp_scaling_factor": 1.0}])

SUM_SCALE = (0, '''\
Strong Scaling Scores:
Strong Scaling Scores:
''', [{"submitter": "Org", "system": "sys1", "bert:time_to_train": 0.0568848374, "bert:GBS": 448.0,
        "bert:samples_to_converge": 2330000.0, "bert:RCP": "Pass",
        "bert:rcp_scaling_factor": 1.0362323319}])

SUM_MANY = (0, '''\
WARNING:root: Found parsing errors:
WARNING:root:  :::MLLOG {"key": "x"
WARNING:root:   ^^  Expecting ',' delimiter: line 1 column 12 (char 11)
WARNING:root: Log lines had parsing errors.
Compliance check failed in pkgb/Org/results/sys1/bert/result_7.txt
WARNING:root: Required EXACTLY_ONE occurrence of 'run_stop' but found 0
Compliance check failed in pkgb/Org/results/sys1/bert/result_8.txt
CRITICAL ERROR: Too many non-converging runs for Org sys1/bert
** CRITICAL ERROR ** Results in the table for Org sys1/bert are NOT correct
WARNING:root: Run incomplete or did not converge. Marking as infinite.
ERROR: RCP Test Failed on Org/sys1/bert with message: Missing RCP, please submit RCP with BS = 16.
WARNING:root: Run incomplete or did not converge. Marking as infinite.
Strong Scaling Scores:
Strong Scaling Scores:
''', [{"submitter": "Org", "system": "sys1", "bert:time_to_train": None, "bert:GBS": 16.0,
        "bert:samples_to_converge": 2651.4285714286, "bert:RCP": "Missing",
        "bert:rcp_scaling_factor": 1.0}])

SUM_ONE_DROPPED = (0, '''\
WARNING:root: Required EXACTLY_ONE occurrence of 'run_stop' but found 0
Compliance check failed in pkgd/Org/results/sys1/bert/result_3.txt
NOTICE: Dropping non-converged run(s) for Org sys1/bert using olympic scoring.
WARNING:root: Run incomplete or did not converge. Marking as infinite.
ERROR: RCP Test Failed on Org/sys1/bert with message: Missing RCP, please submit RCP with BS = 16.
WARNING:root: Run incomplete or did not converge. Marking as infinite.
Strong Scaling Scores:
Strong Scaling Scores:
''', [{"submitter": "Org", "system": "sys1", "bert:time_to_train": 0.0556916667, "bert:GBS": 16.0,
        "bert:samples_to_converge": 2680.0, "bert:RCP": "Missing", "bert:rcp_scaling_factor": 1.0}])


# ---- compliance_checker --------------------------------------------------------------------------

def test_compliance_pass():
    assert C.parse_compliance(*CC_PASS) == (PASS, "compliant")


def test_compliance_duplicate_is_a_warning_not_a_failure():
    assert C.parse_compliance(*CC_DUP) == (
        PASS, "passed with warnings: Required EXACTLY_ONE occurrence of 'run_start' but found 2")


@pytest.mark.parametrize("captured, detail", [
    (CC_NOSTOP, "Required EXACTLY_ONE occurrence of 'run_stop' but found 0"),
    (CC_JSON, "parse error: Expecting ',' delimiter: line 1 column 12 (char 11)"),
    (CC_BLOCK, "CHECK for 'block_start' failed in line 2: failed test: s['run_started']"),
    (CC_LOWACC, "Failed checks for eval_accuracy : (v['value'] >= 0.720) and v['value'] < 1.0"),
])
def test_compliance_failures(captured, detail):
    assert C.parse_compliance(*captured) == (FAIL, detail)


def test_compliance_crash_is_a_failure_with_the_exception():
    assert C.parse_compliance(*CC_NOMETA) == (
        FAIL, "compliance_checker gave no verdict (exit 1): KeyError: 'metadata'")


def test_compliance_success_line_with_failing_exit_is_not_a_pass():
    assert C.parse_compliance(1, CC_PASS[1])[0] == FAIL


# ---- rcp_checker ---------------------------------------------------------------------------------

def test_rcp_pass():
    assert C.parse_rcp(*RCP_FOUND) == (
        PASS, "RCP found (olympic mean samples to converge 2,440,000)")


def test_rcp_pass_with_normalisation():
    verdict, detail = C.parse_rcp(*RCP_SCALE)
    assert verdict == PASS and "score to be scaled by 1.0362" in detail


def test_rcp_missing_fails_and_bypass_is_shown_as_bypass():
    assert C.parse_rcp(*RCP_MISSING) == (
        FAIL, "Missing RCP, please submit RCP with BS = 16 "
              "(olympic mean samples to converge 2,680)")
    verdict, detail = C.parse_rcp(*RCP_MISSING, rcp_bypass=True)
    assert verdict == BYPASS
    assert detail.startswith("RCP check failed: Missing RCP, please submit RCP with BS = 16; ")


def test_rcp_bypass_covers_only_what_the_package_checker_bypasses():
    out = "ERROR - Insufficient convergence, RCP test FAILED, consider adding --rcp_bypass ...\n"
    assert C.parse_rcp(1, out, rcp_bypass=True)[0] == FAIL
    out = "ERROR - RCP found, RCP test FAILED, consider adding --rcp_bypass ...\n"
    assert C.parse_rcp(1, out, rcp_bypass=True)[0] == BYPASS


def test_rcp_crash():
    assert C.parse_rcp(*RCP_EMPTY) == (FAIL, "rcp_checker gave no verdict (exit 1): KeyError: None")


# ---- package_checker (always exits 0) ------------------------------------------------------------

def test_package_rcp_failure_is_found_in_the_text_despite_exit_0():
    assert PC_MISSING[0] == 0
    assert C.parse_package(*PC_MISSING) == (
        FAIL, "RCP Test Failed: Missing RCP, please submit RCP with BS = 16")


def test_package_bypass():
    assert C.parse_package(*PC_BYPASS) == (
        BYPASS, "RCP check failed: Missing RCP, please submit RCP with BS = 16; "
                "let through by the RCP bypass")


def test_package_many_errors():
    verdict, detail = C.parse_package(*PC_MANY)
    assert verdict == FAIL
    assert detail.startswith("Incorrect number of files in dir, or wrong file names in directory "
                             "pkgb/Org/results/sys1/bert, found 9, expected 10; 2 files do not "
                             "comply, directory cannot be accepted; Seed checker failed")
    assert detail.endswith("(+1 more)")  # the final 'Seed checker failed'


def test_package_pass_with_scaling():
    assert C.parse_package(*PC_SCALE) == (
        PASS, "RCP: RCP found; score to be scaled by 1.0362 (scaling.json written)")


def test_package_one_noncompliant_file_is_tolerated():
    verdict, detail = C.parse_package(*PC_ONE_TOLERATED)
    assert verdict == BYPASS and "1 result file does not comply" in detail


def test_package_success_without_a_bert_folder_is_a_failure():
    out = ("INFO -  Checking System Description Files\n"
           "INFO -   System description checker passed for sys1\n"
           "INFO - ------------------------------\n"
           "INFO - PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !\n")
    assert C.parse_package(0, out) == (FAIL, "no results/<system>/bert folder: nothing was checked")


def test_package_crash():
    out = "Traceback (most recent call last):\n  ...\nFileNotFoundError: [Errno 2] x/systems/s.json\n"
    assert C.parse_package(1, out) == (
        FAIL, "package_checker gave no verdict (exit 1): FileNotFoundError: [Errno 2] "
              "x/systems/s.json")


# ---- system_desc_checker (always exits 0) --------------------------------------------------------

def test_system_desc():
    assert C.parse_system_desc(*SD_PASS) == (PASS, "all fields present for system_name 'sys1'")
    assert C.parse_system_desc(*SD_MISSING) == (
        FAIL, "['Missing field cooling', 'Missing field sw_notes']")
    verdict, detail = C.parse_system_desc(*SD_STATUS)
    assert verdict == FAIL and "Field status contains a non valid value: onprem" in detail
    verdict, detail = C.parse_system_desc(*SD_BADJSON)
    assert verdict == FAIL and "JSONDecodeError" in detail


# ---- result_summarizer ---------------------------------------------------------------------------

def test_summarizer_rcp_missing():
    rc, out, rows = SUM_MISSING
    verdict, detail = C.parse_summarizer(rc, out, rows, "Org", "sys1")
    assert verdict == FAIL
    assert detail == ("bert 0.0549 min, 2,680 samples to converge, GBS 16, RCP Missing "
                      "(RCP check failed: Missing RCP, please submit RCP with BS = 16)")
    assert C.parse_summarizer(rc, out, rows, "Org", "sys1", rcp_bypass=True)[0] == BYPASS


def test_summarizer_scaled_pass():
    rc, out, rows = SUM_SCALE
    assert C.parse_summarizer(rc, out, rows, "Org", "sys1") == (
        PASS, "bert 0.0569 min, 2,330,000 samples to converge, GBS 448, scaled by 1.0362, RCP Pass")


def test_summarizer_too_many_failures():
    rc, out, rows = SUM_MANY
    assert C.parse_summarizer(rc, out, rows, "Org", "sys1", rcp_bypass=True) == (
        FAIL, "too many non-converging or non-compliant runs: no score")


def test_summarizer_names_the_dropped_run():
    rc, out, rows = SUM_ONE_DROPPED
    verdict, detail = C.parse_summarizer(rc, out, rows, "Org", "sys1", rcp_bypass=True)
    assert verdict == BYPASS and "dropped: result_3.txt" in detail


def test_summarizer_without_json():
    verdict, detail = C.parse_summarizer(0, "Strong Scaling Scores:\n", None, "Org", "sys1")
    assert verdict == FAIL and detail.startswith("no score for Org/sys1")


# ---- bypass file, olympic downgrade, table ---------------------------------------------------------

def test_bypass_file_needs_no_trailing_newline(tmp_path):
    bert = tmp_path / "results" / "sys" / "bert"
    bert.mkdir(parents=True)
    assert C.bypass_declared(bert) == (False, "")
    (bert / "package_checker_params").write_text("rcp-bypass\n")
    declared, note = C.bypass_declared(bert)
    assert not declared and "trailing newline" in note
    (bert / "package_checker_params").write_bytes(b"rcp-bypass")
    assert C.bypass_declared(bert) == (True, "")
    (bert / "package_checker_params").unlink()
    (bert.parent / "package_checker_params").write_bytes(b"seed-checker-bypass\nrcp-bypass")
    assert C.bypass_declared(bert) == (True, "")


def test_one_failed_result_file_accepted_by_the_package_checker_is_a_warning():
    pkg = Result("package", "/s/Org", BYPASS, "", output=PC_ONE_TOLERATED[1])
    bad = Result("compliance", "/s/Org/results/sys1/bert/result_3.txt", FAIL, "x", package="/s/Org")
    loose = Result("compliance", "/logs/result_3.txt", FAIL, "x")
    C._olympic([pkg, bad, loose])
    assert (bad.verdict, loose.verdict) == (WARN, FAIL)
    two = [Result("compliance", f"/s/Org/results/sys1/bert/result_{i}.txt", FAIL, "x",
                  package="/s/Org") for i in (3, 4)]
    C._olympic([pkg] + two)
    assert [r.verdict for r in two] == [FAIL, FAIL]


def test_table_and_summary():
    results = [Result("compliance", "a/result_0.txt", PASS, "compliant"),
               Result("package", "Org", BYPASS, "RCP check failed: Missing RCP, please submit RCP "
                                                "with BS = 16; let through by the RCP bypass")]
    table = C.format_table(results).splitlines()
    assert table[0].split() == ["check", "target", "verdict", "detail"]
    assert table[2].split()[:3] == ["compliance", "a/result_0.txt", "PASS"]
    text = "\n".join(C.summary_lines(results, rcp_bypass=True))
    assert "2 checks (mlperf-logging" in text and "1 PASS, 1 BYPASS" in text
    assert "Global batch size 16 is not in the bert RCP table of ruleset 5.0.0" in text
    assert "448" in text  # the table's batch sizes, read from mlperf-logging's rcps_bert.json


def test_ruleset_matches_the_logger():
    from bertperf.benchmark import RULESET
    assert RULESET == "5.0.0"


# ---- command line --------------------------------------------------------------------------------

def test_check_needs_something(capsys):
    assert cli(["check"], capsys) == (
        1, "", "bertperf: error: nothing to check: give --logs, --results or --submission\n")


@pytest.mark.parametrize("flag, message", [
    ("--logs", "log file {p} does not exist"),
    ("--results", "results folder {p} does not exist"),
    ("--submission", "submission folder {p} does not exist"),
])
def test_missing_paths_are_one_line_errors(tmp_path, capsys, flag, message):
    p = tmp_path / "nowhere"
    assert cli(["check", flag, str(p)], capsys) == (
        1, "", f"bertperf: error: {message.format(p=p)}\n")


def test_folder_without_logs(tmp_path, capsys):
    rc, _, err = cli(["check", "--logs", str(tmp_path)], capsys)
    assert (rc, err) == (1, f"bertperf: error: log folder {tmp_path} has no result_*.txt files\n")
    rc, _, err = cli(["check", "--submission", str(tmp_path)], capsys)
    assert rc == 1 and err.startswith(f"bertperf: error: submission folder {tmp_path} has no ")


def test_check_one_broken_log_names_it(tmp_path, capsys):
    log = tmp_path / "result_0.txt"
    log.write_text(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
                   '"key": "cache_clear", "value": true, "metadata": {"file": "x", "lineno": 1}}\n')
    rc, out, _ = cli(["check", "--logs", str(log)], capsys)
    row = [l for l in out.splitlines() if l.startswith("compliance ")]
    assert rc == 1 and len(row) == 1 and str(log) in row[0] and " FAIL " in row[0]
    assert f"FAILED: {log}" in out


def test_a_file_with_no_mlperf_line_is_said_to_be_no_log(tmp_path, capsys):
    """Not the checker's first missing key ("Required EXACTLY_ONE occurrence of ...")."""
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "notes.md").write_text("# a README\n")
    rc, out, _ = cli(["check", "--logs", str(tmp_path / "empty.txt"), str(tmp_path / "notes.md")],
                     capsys)
    rows = [line.split(None, 3) for line in out.splitlines() if line.startswith("compliance ")]
    assert rc == 1 and [r[3] for r in rows] == ["not an MLPerf log (no :::MLLOG line)"] * 2


# ---- submission pieces ---------------------------------------------------------------------------

def test_system_description_passes_the_checker(tmp_path):
    from bertperf.mlperf.submission import SYSTEM_FIELDS, describe_system
    desc = describe_system("bertperf", "cpu_box", status="research",
                           fields={"cooling": "air", "host_storage_type": "SSD"})
    assert list(desc) == list(SYSTEM_FIELDS) and all(isinstance(v, str) for v in desc.values())
    assert desc["framework"].startswith("PyTorch ") and desc["submitter"] == "bertperf"
    assert desc["status"] == "Research, Development, or Internal (RDI)"
    assert desc["cooling"] == "air" and int(desc["accelerators_per_node"]) >= 0
    assert int(desc["host_processor_vcpu_count"]) >= 1 and desc["host_memory_capacity"]
    path = tmp_path / "cpu_box.json"
    path.write_text(json.dumps(desc))
    run = subprocess.run([sys.executable, "-m", "mlperf_logging.system_desc_checker", str(path),
                          "training", "5.0.0", "--log_output", str(tmp_path / "log")],
                         capture_output=True, text=True)
    assert C.parse_system_desc(run.returncode, run.stdout + run.stderr)[0] == PASS, run.stderr


@pytest.mark.parametrize("fields, message", [
    ({"colour": "red"}, "--field colour: not a system description field"),
    ({"submitter": "x"}, "--field submitter: set it with --org"),
])
def test_bad_fields(fields, message):
    from bertperf.mlperf.submission import describe_system
    with pytest.raises(UserError, match=message):
        describe_system("o", "s", fields=fields)


def test_parse_fields():
    from bertperf.mlperf.submission import parse_fields
    assert parse_fields(["cooling=air", "hw_notes=a=b"]) == {"cooling": "air", "hw_notes": "a=b"}
    with pytest.raises(UserError, match="'cooling' is not KEY=VALUE"):
        parse_fields(["cooling"])


def test_implementation_snapshot_has_sources_only():
    from bertperf.mlperf.submission import implementation_files
    rel = {str(r) for _, r in implementation_files()}
    assert "implementations/pytorch/bertperf/__init__.py" in rel
    assert "implementations/pytorch/bertperf/mlperf/submission.py" in rel
    assert "README.md" in rel
    assert not [r for r in rel if r.endswith((".pyc", ".so")) or "__pycache__" in r]
    assert not [r for r in rel if r.startswith(("tests/", "build/", ".git/"))]


def test_submission_refuses_wrong_log_count(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    for i in range(3):
        (tmp_path / "runs" / f"result_{i}.txt").write_text("")
    rc, _, err = cli(["submission", "--run-dir", str(tmp_path / "runs"), "--org", "Org",
                      "--system", "sys", "--out", str(tmp_path / "out")], capsys)
    assert (rc, err) == (1, f"bertperf: error: run directory {tmp_path / 'runs'} has 3 result "
                            "logs matching 'result_*.txt'; a bert submission needs exactly 10 "
                            "(either division)\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag, value", [("--org", "a/b"), ("--system", "..")])
def test_submission_refuses_bad_names(tmp_path, capsys, flag, value):
    argv = {"--run-dir": str(tmp_path), "--org": "Org", "--system": "sys",
            "--out": str(tmp_path / "out"), flag: value}
    rc, _, err = cli(["submission"] + [x for kv in argv.items() for x in kv], capsys)
    assert rc == 1 and err.startswith(f"bertperf: error: {flag} {value!r}: use letters")


def test_relative_paths_and_the_committed_results_pass(capsys, monkeypatch):
    """The tools run in a scratch folder: a path relative to the caller must still be found.
    The logs in results/ (real runs) must keep passing."""
    monkeypatch.chdir(ROOT)
    logs = sorted(Path("results").glob("*/bert/result_*.txt"))
    assert len(logs) == 10
    rc, out, err = cli(["check", "--logs", *map(str, logs)], capsys)
    assert rc == 0, out + err
    assert out.count(" PASS ") == 10


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute"])
def test_paths_from_any_folder_leave_it_untouched(tmp_path, capsys, monkeypatch, relative):
    """`submission` and `check` run from a folder that is neither the repository's nor the tools'
    scratch folder: every path flag works relative to it or absolute, and the folder ends up with
    the inputs and the submission only (the checkers' own log files go to the scratch folder)."""
    work = tmp_path / "work"
    runs = work / "runs" / "sys1" / "bert"
    runs.mkdir(parents=True)
    for log in sorted(ROOT.glob("results/*/bert/result_*.txt")):
        shutil.copy(log, runs / log.name)
    assert len(list(runs.iterdir())) == 10
    shutil.copy(ROOT / "config_CPU_1x2x32x1.sh", work / "config_CPU_1x2x32x1.sh")
    inputs = _tree(work)
    monkeypatch.chdir(work)

    def arg(rel: str) -> str:
        return rel if relative else str(work / rel)

    rc, out, err = cli(["submission", "--run-dir", arg("runs"), "--org", "Org", "--system",
                        "sys", "--out", arg("out"), "--config-file", arg("config_CPU_1x2x32x1.sh"),
                        "--division", "open", "--field", "cooling=air"], capsys)
    assert rc == 0, err
    assert f"wrote {Path(arg('out')) / 'Org'}" in out
    org = work / "out" / "Org"
    assert sorted(p.name for p in (org / "results" / "sys" / "bert").iterdir()) == \
        [f"result_{i}.txt" for i in range(10)]
    assert (org / "benchmarks/bert/implementations/pytorch/config_CPU_1x2x32x1.sh").is_file()

    rc, out, err = cli(["check", "--logs", arg("runs/sys1/bert"), "--results", arg("runs/sys1"),
                        "--submission", arg("out/Org"), "--rcp-bypass"], capsys)
    assert rc == 0, out + err
    verdicts = [line.split()[2] for line in out.splitlines()
                if line.split()[:1] in (["compliance"], ["rcp"], ["system-desc"], ["package"],
                                        ["summarizer"])]
    assert len(verdicts) == 10 + 1 + 1 + 10 + 2 and set(verdicts) == {PASS, BYPASS}, out

    assert sorted(p.name for p in work.iterdir()) == ["config_CPU_1x2x32x1.sh", "out", "runs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert sorted(p.name for p in (work / "out").iterdir()) == ["Org"]
    assert {k: v for k, v in _tree(work).items() if not k.startswith("out/")} == inputs
    assert sorted(p.name for p in org.iterdir()) == ["benchmarks", "results", "systems"]
    assert sorted(p.name for p in (org / "results" / "sys" / "bert").iterdir()) == \
        [f"result_{i}.txt" for i in range(10)]
    assert sorted(p.name for p in (org / "systems").iterdir()) == ["sys.json"]


def test_a_log_that_repeats_another_is_refused_by_submission_and_check(tmp_path, capsys,
                                                                       monkeypatch):
    """Ten copies of one log passed `submission --division open` and `check --submission` (the
    package checker checks seeds only in the closed division). A copy is the same bytes, or the
    same run (init_start and run_start at the same times) edited: `submission` refuses it in one
    line, `check --submission` FAILs its results folder (row "runs"); ten runs pass."""
    committed = sorted((ROOT / "results").glob("*/bert/result_*.txt"), key=C.natural_key)
    runs = tmp_path / "runs"
    runs.mkdir()
    for i, log in enumerate(committed):
        shutil.copy(committed[0] if i in (0, 3) else log, runs / log.name)
    edited = committed[0].read_text().replace('"1xCPU (2 cores)"', '"2xCPU (4 cores)"')
    assert edited != committed[0].read_text()
    (runs / "result_7.txt").write_text(edited)
    assert [(a.name, b.name, how) for a, b, how in C.repeated_runs(sorted(runs.iterdir()))] == [
        ("result_3.txt", "result_0.txt", "the same bytes"),
        ("result_7.txt", "result_0.txt",
         "the same run: init_start and run_start at the same times")]
    rc, _, err = cli(["submission", "--run-dir", str(runs), "--org", "Org", "--system", "sys",
                      "--out", str(tmp_path / "out"), "--division", "open"], capsys)
    assert (rc, err) == (1, f"bertperf: error: result log {runs / 'result_3.txt'} repeats "
                            f"{runs / 'result_0.txt'} (the same bytes): a bert submission needs "
                            "10 separate runs\n")
    assert not (tmp_path / "out").exists()

    org = tmp_path / "Org"
    shutil.copytree(runs, org / "results" / "sys" / "bert")
    monkeypatch.setattr(C, "run_tool", lambda module, args, workdir: (0, "", 0.0))  # the tools
    (row,) = [r for r in C.run_checks(submissions=[org]) if r.check == "runs"]
    assert (row.target, row.verdict, row.detail) == (
        str(org / "results" / "sys" / "bert"), FAIL,
        "result_3.txt repeats result_0.txt (the same bytes) (and 1 more)")
    assert C.check_runs(committed[0].parent) == Result(
        "runs", str(committed[0].parent), PASS, "10 logs, 10 runs")
