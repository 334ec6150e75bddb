"""The variable each test's processes are tagged with (tests/conftest.py), so that none outlives
its test (bertperf.reaper finds and kills them)."""

TAG = "BERTPERF_TEST_ID"
