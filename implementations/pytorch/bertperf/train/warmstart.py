"""The sanity eval right after MLPerf's initial checkpoint (INIT_CHECKPOINT) is loaded (it is read
and checked before the run's log opens: train.loop.read_inputs).

The reference notes that the masked-LM accuracy of `model.ckpt-28252` before any training "should
be very close to 0.34085". Evaluating there catches the known failure modes early, before any
timed work: a wrong or partly loaded checkpoint (an MLM head left at random init scores about 0),
a wrong vocab, and stopping code that would report "target reached" at the first eval.
"""

from __future__ import annotations

from typing import Callable

from bertperf.benchmark import INIT_ACCURACY
from bertperf.model.bert_config import BertConfig

TOLERANCE = 0.01


def sanity_eval(evaluate: Callable[[], float], config: BertConfig,
                report: Callable[[str], None], warn: Callable[[str], None]) -> float:
    """Evaluate the freshly loaded weights; warn when a BERT-large checkpoint is not within
    TOLERANCE of the reference's INIT_ACCURACY."""
    accuracy = evaluate()
    report(f"init checkpoint: mlm accuracy {accuracy:.5f} before training")
    if config.is_mlperf_large and abs(accuracy - INIT_ACCURACY) > TOLERANCE:
        warn(f"init checkpoint: mlm accuracy {accuracy:.5f} is far from the reference's "
             f"{INIT_ACCURACY} for model.ckpt-28252 (wrong checkpoint, vocab or eval set?)")
    return accuracy
