"""What MLPerf Training fixes for the BERT benchmark: its name, ruleset, quality target, eval set,
divisions, submission size and the reference's data flags. Every module that needs one of these
values takes it from here (shell scripts leave them to the trainer's defaults).

Sources: the training rules and mlperf-logging's checkers for ruleset 5.0.0 (BERT's last), the
reference `create_pretraining_data.py` flags and its initial checkpoint's documented accuracy.
"""

BENCHMARK = "bert"
"""The benchmark's name in logs, RESULT lines and submission folders (mllog's constants.BERT)."""
RULESET = "5.0.0"
"""The MLPerf Training ruleset the logs and checkers follow (BERT's last)."""
TARGET_ACCURACY = 0.720
"""Masked-LM accuracy a closed-division run must reach."""
EVAL_SAMPLES = 10_000
"""Samples in the eval set (`prep eval` picks them from eval.txt's samples)."""
CLOSED, OPEN = DIVISIONS = ("closed", "open")
"""Submission divisions: closed is the benchmark as defined; open allows other models/targets."""
RESULT_COUNT = 10
"""Runs (result_*.txt logs) a closed BERT submission holds."""
INIT_ACCURACY = 0.34085
"""Masked-LM accuracy of the initial checkpoint model.ckpt-28252 on the eval set (reference)."""

MAX_SEQ_LENGTH = 512
"""Tokens per sample (create_pretraining_data.py --max_seq_length)."""
MAX_PREDICTIONS = 76
"""Masked positions per sample at most (--max_predictions_per_seq)."""
MASKED_LM_PROB = 0.15
"""Share of tokens masked (--masked_lm_prob)."""
RANDOM_SEED = 12345
"""Seed of every part's sample generation and of the eval-article split (--random_seed)."""
DUPE_FACTOR = 10
"""Passes over each part's documents (--dupe_factor)."""
CREATE_FLAGS = (f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}",
                f"--masked_lm_prob={MASKED_LM_PROB}", f"--random_seed={RANDOM_SEED}",
                f"--dupe_factor={DUPE_FACTOR}")
"""The flags of `create_pretraining_data.py` (and `prep create`) that make MLPerf's samples."""
