"""`python -m bertperf` run in the test's own process (bertperf.__main__.main): what it returns
and prints, read through pytest's capsys."""

from __future__ import annotations


def cli(argv, capsys):
    """What `python -m bertperf <argv>` returns and prints."""
    from bertperf.__main__ import main
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err
