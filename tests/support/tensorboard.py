"""TENSORBOARD=1's event files read back as TensorBoard reads them."""

from __future__ import annotations

from pathlib import Path


def curves(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """The curves in `folder` as TensorBoard shows them, (step, value) by tag: what a resumed
    run purged left out."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}
