"""Where things are, defined once: the checkout's root, the PYTHONPATH a subprocess needs to
import bertperf and tests from it, ../shared beside the checkout (the Wikipedia sample lives
there only) and the committed test fixtures. A module that needs one of these imports it."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (the checkout)."""
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT / "implementations" / "pytorch"), str(ROOT),
                                           os.environ.get("PYTHONPATH")]))
"""bertperf's package folder and the root (for `tests`), as a child process's PYTHONPATH, before
the one this process was given (packages installed beside an environment, as `make gpu-check`
installs its bundle's, stay importable in the child)."""
SHARED = ROOT.parent / "shared"
WIKI_SAMPLE = Path(os.environ.get("WIKI_SAMPLE") or SHARED / "data" / "wiki_sample")
"""A wikiextractor folder (wiki_00..03) for the tests that need real Wikipedia text: $WIKI_SAMPLE,
else the developers' sample beside the checkout."""
TF_CKPT = ROOT / "tests" / "fixtures" / "tf_ckpt"
"""A small TF checkpoint written by real TensorFlow (make_tf_checkpoint.py beside it)."""
