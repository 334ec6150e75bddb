"""MLPerf's reference convergence points (RCPs) for BERT, ruleset 5.0.0, read from the RCP table
that ships inside the installed `mlperf_logging` package (so there is no second copy of the
numbers here). Closed-division BERT must use a global batch size the RCP checker can judge: one
of the RCP rows, or between two of them (interpolated); above the largest (16,384) the checker
answers "Missing RCP" and the submission fails. A batch below the smallest pruned row passes only
if it converges no faster than that row.

The per-cluster config files take their hyperparameters from the row of their global batch size;
`check_global_batch` is what the trainer runs before any work when the model is BERT-large.
`reference_for` is what the checker judges a run at a global batch against (its own code,
run as the package checker runs it: on the pruned rows), which `plan` predicts with."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from bertperf.errors import UserError
from bertperf.benchmark import RULESET


@dataclass(frozen=True)
class ReferencePoint:
    """One RCP row: the hyperparameters the reference ran with at batch size `bs`."""

    bs: int
    lr: float
    max_steps: int
    warmup_steps: float
    start_warmup_step: float
    beta1: float
    beta2: float
    weight_decay: float
    epsilon: float
    gradient_accumulation_steps: int
    samples_to_converge: tuple[int, ...]


def table_path(ruleset: str = RULESET) -> Path:
    import mlperf_logging
    return Path(mlperf_logging.__file__).parent / "rcp_checker" / f"training_{ruleset}" / \
        "rcps_bert.json"


@lru_cache(maxsize=None)
def reference_points(ruleset: str = RULESET) -> tuple[ReferencePoint, ...]:
    """Every BERT RCP row of the ruleset, by batch size."""
    path = table_path(ruleset)
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the RCP table of mlperf_logging ({exc})") from None
    points = []
    for row in rows.values():
        h = row["Hyperparams"]
        points.append(ReferencePoint(
            bs=int(row["BS"]), lr=h["opt_base_learning_rate"],
            max_steps=int(h["opt_learning_rate_training_steps"]),
            warmup_steps=h["num_warmup_steps"], start_warmup_step=h["start_warmup_step"],
            beta1=h["opt_lamb_beta_1"], beta2=h["opt_lamb_beta_2"],
            weight_decay=h["opt_lamb_weight_decay_rate"], epsilon=h["opt_epsilon"],
            gradient_accumulation_steps=int(h["gradient_accumulation_steps"]),
            samples_to_converge=tuple(int(x) for x in row["Epochs to converge"])))
    return tuple(sorted(points, key=lambda p: p.bs))


def point_for(bs: int) -> ReferencePoint | None:
    """The RCP row with exactly this batch size, if any."""
    return next((p for p in reference_points() if p.bs == bs), None)


def check_global_batch(bs: int) -> None:
    """A one-line error when the RCP checker could not judge a run at this global batch size."""
    largest = reference_points()[-1].bs
    if bs > largest:
        raise UserError(f"global batch size {bs} is above the largest BERT RCP ({largest}, "
                        f"ruleset {RULESET}): the RCP checker would fail the submission "
                        "(\"Missing RCP\"); use BATCHSIZE*GRADIENT_STEPS*ranks <= "
                        f"{largest}")


@dataclass(frozen=True)
class Reference:
    """What the RCP checker judges a submission at global batch `bs` against: the reference's
    samples to converge and the fewest it accepts (mlperf_logging's RCP Mean and Min Epochs)."""

    bs: int
    mean: float
    """The reference's samples to converge: a row's olympic mean (the fastest and slowest of
    its runs left out), or interpolated between the two rows around `bs`."""
    fewest: float
    """The least mean of a submission's runs the checker accepts (faster fails the check)."""
    how: str
    """Which rows it comes from, in words."""


@cache
def _checker():
    from mlperf_logging.rcp_checker.rcp_checker import RCP_Checker
    return RCP_Checker("training", RULESET, "bert", False)


PASS = "pruned_rcps"
"""The rows the package checker judges with (mlperf_logging's package_checker: rcp_pass): those
left after it prunes every row that converges slower than the rows around it predict."""


def reference_for(bs: int) -> Reference:
    """The RCP checker's reference at global batch `bs`, built by its own code as the package
    checker runs it (`PASS`): the row of `bs`, else interpolated between the rows below and
    above it; below the smallest row, that row (a run there must converge no faster); above the
    largest, a one-line error (the checker has none: "Missing RCP")."""
    check_global_batch(bs)
    checker = _checker()
    record = checker._find_rcp(bs, PASS)
    if record is not None:
        how = f"RCP row {bs}"
    else:
        low, high = checker._find_top_min_rcp(bs, PASS), checker._find_bottom_max_rcp(bs, PASS)
        if low is None:
            record = checker._find_min_rcp(PASS)
            how = (f"below the smallest RCP row, {record['BS']}: judged against it (no "
                   "faster)")
        else:
            _, record = checker._create_interp_rcp(bs, low, high)
            how = f"interpolated between RCP rows {low['BS']} and {high['BS']}"
    return Reference(bs, float(record["RCP Mean"]), float(record["Min Epochs"]), how)


def nearest_point(bs: int) -> ReferencePoint:
    """The RCP row whose batch size is nearest `bs` (the smaller of two as near): the
    hyperparameters a config at `bs` starts from."""
    return min(reference_points(), key=lambda p: (abs(p.bs - bs), p.bs))
