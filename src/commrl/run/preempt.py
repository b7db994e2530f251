"""The announced end of a job: a preemption or time-limit warning, received as SIGUSR1 or SIGTERM.

Slurm announces the end of an allocation with a signal: ``sbatch --signal=USR1@<lead>`` sends SIGUSR1
``<lead>`` seconds before the time limit; preemption, the time limit itself and ``scancel`` send SIGTERM
(SIGKILL follows after the cluster's ``KillWait`` or ``GraceTime``). On a workstation, the terminal that
ran ``make pipeline`` sends SIGHUP when it closes; it is taken the same way. A command that trains runs inside
``watch()``, whose handlers only record the signal. The driver polls ``requested()`` at its safe
point (after a finished tick), writes a checkpoint, marks its MLflow run (``record.mark_preempted``: tag
``preempted`` = the tick, status KILLED, never FAILED) and raises ``Preempted``; the command line turns it
into ``EXIT_PREEMPTED``. A rerun resumes from that checkpoint into the same MLflow run.

``EXIT_PREEMPTED`` is 75, ``EX_TEMPFAIL`` of sysexits.h ("temporary failure: try again later"): nothing
is wrong with the run, it was stopped on request and a rerun continues it. The warning's lead time must
cover the rest of a tick plus the checkpoint (README, "Preemption and time limits").
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_PREEMPTED = 75
SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal of `make pipeline` closed

_received: int | None = None  # the first announcing signal received by this process


class Preempted(Exception):
    """Raised by a driver after it checkpointed on a request; ``tick`` is the tick saved (None: nothing to
    save, e.g. a sweep worker between trials). Picklable, so that it crosses Ray's process boundary."""

    def __init__(self, tick: int | None, signum: int | None = None):
        super().__init__(tick, signum)
        self.tick = tick
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "request"

    def __str__(self) -> str:
        at = f" after tick {self.tick} (checkpoint written)" if self.tick is not None else ""
        return f"preempted by {self.signal_name}{at}"


def _record(signum: int, frame: FrameType | None) -> None:
    global _received
    if _received is None:
        _received = signum


@contextmanager
def watch() -> Iterator[bool]:
    """While active, SIGUSR1, SIGTERM and SIGHUP are recorded instead of ending the process; on exit the
    previous handlers come back and the record is cleared. Yields False, and installs nothing, off the main
    thread (Python sets handlers there only)."""
    global _received
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    _received = None
    previous = {signum: signal.signal(signum, _record) for signum in SIGNALS}
    try:
        yield True
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _received = None


def requested() -> bool:
    """Whether an announcing signal has arrived inside ``watch()``."""
    return _received is not None


def received() -> int | None:
    """The signal that arrived first (one of ``SIGNALS``), None before any."""
    return _received


def shield() -> None:
    """Ignore SIGUSR1 in this process and in every process it starts from now on (an ignored signal stays
    ignored across ``exec``, a handled one does not). For a driver whose helpers die of the signal by
    default (Ray's daemons and workers, vLLM) while one process of theirs acts on it (``watch()``)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def preempted_in(error: BaseException | None) -> Preempted | None:
    """The ``Preempted`` that ``error`` is or wraps (Ray re-raises a remote one with it as ``cause``)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        cause = getattr(error, "cause", None)
        if isinstance(cause, Preempted):
            return cause
        if isinstance(error, Preempted):
            return error
        error = error.__cause__ or error.__context__
    return None
