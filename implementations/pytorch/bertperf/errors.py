"""The one exception type for bad input: its message is printed as one line and the program exits 1.
And the one other way a command ends without success: a run stopped at the preemption warning."""

import signal

PREEMPTION_SIGNAL = signal.SIGUSR1
"""The warning Slurm sends before a job's time limit or its preemption (run.sub asks for it:
--signal=B:USR1@seconds): the trainer checkpoints at the next step boundary the ranks agree on
(train.checkpoint.Checkpointer.preempted); `launch` passes it to its ranks."""
PREEMPTED = 75
"""The exit status of a run stopped by the preemption warning, its checkpoint saved (EX_TEMPFAIL
of sysexits.h: try again): `launch` and run_and_time.sh pass it on, and run.sub requeues the job
on it."""


class UserError(Exception):
    """Bad input or environment. The message names the file (and line or sample) and fits on one line."""
