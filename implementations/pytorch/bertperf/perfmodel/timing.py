"""A run's time to train, term by term: the one prediction every cluster model of perfmodel/
(scale's DGX and commodity clusters, cluster.py's published results and `plan`) answers with."""

from __future__ import annotations

from dataclasses import dataclass

RUN_TERMS = ("evals", "run")
"""Terms of the run that are not part of a training step."""


@dataclass(frozen=True)
class Prediction:
    samples: float
    """Samples trained."""
    global_batch: float
    """Samples a step."""
    evals: float
    terms: dict[str, float]
    """Seconds of each term over the whole run."""

    @property
    def seconds(self) -> float:
        """The time to train."""
        return sum(self.terms.values())

    @property
    def steps(self) -> float:
        return self.samples / self.global_batch

    @property
    def per_step(self) -> dict[str, float]:
        """Seconds of each term a step (the run's terms spread over the steps)."""
        return {k: v / self.steps for k, v in self.terms.items()}

    @property
    def step_seconds(self) -> float:
        """A training step, the run's terms not counted."""
        return sum(v for k, v in self.terms.items() if k not in RUN_TERMS) / self.steps

    @property
    def dominant(self) -> str:
        return max(self.terms, key=self.terms.get)


def duration(seconds: float) -> str:
    """A time to train as the model's tables write it."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.2f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:.1f} days"
