"""The announced end of a job (``commrl.run.preempt``); the MLflow mark: tests/rl/test_preemption.py."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading

from commrl.run import preempt


def test_watch_records_the_signal_instead_of_dying_and_restores_the_handlers():
    before = {s: signal.getsignal(s) for s in preempt.SIGNALS}
    with preempt.watch() as watching:
        assert watching and not preempt.requested()
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal does not replace the first
        assert preempt.requested() and preempt.received() == signal.SIGUSR1
    assert {s: signal.getsignal(s) for s in preempt.SIGNALS} == before
    assert not preempt.requested() and preempt.received() is None


def test_a_closed_terminals_hangup_is_a_stop_request_like_sigterm():
    """A training job of `make pipeline` gets SIGHUP when its terminal closes (its client forwards it to
    the fork): recorded, so the run checkpoints and exits 75 instead of dying mid-tick."""
    script = (
        "import os, signal\n"
        "from commrl.run import preempt\n"
        "with preempt.watch():\n"
        "    os.kill(os.getpid(), signal.SIGHUP)\n"
        "    print(preempt.requested(), preempt.received() == signal.SIGHUP)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "True True"), done.stderr


def test_watch_off_the_main_thread_installs_nothing():
    before = signal.getsignal(signal.SIGUSR1)
    seen = []

    def worker() -> None:
        with preempt.watch() as watching:
            seen.append(watching)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [False] and signal.getsignal(signal.SIGUSR1) is before


def test_preempted_survives_pickling_and_is_found_in_a_chain_or_a_ray_error():
    from ray.exceptions import RayTaskError

    stop = preempt.Preempted(7, signal.SIGTERM)
    back = pickle.loads(pickle.dumps(stop))
    assert (back.tick, back.signum, back.signal_name) == (7, signal.SIGTERM, "SIGTERM")
    assert str(back) == "preempted by SIGTERM after tick 7 (checkpoint written)"
    assert str(preempt.Preempted(None)) == "preempted by request"

    remote = RayTaskError("run", "Traceback ...", stop).as_instanceof_cause()  # what ray.get raises
    assert preempt.preempted_in(remote) is stop
    try:
        try:
            raise stop
        except preempt.Preempted as err:
            raise RuntimeError("wrapped") from err
    except RuntimeError as err:
        assert preempt.preempted_in(err) is stop
    assert preempt.preempted_in(RuntimeError("other")) is None and preempt.preempted_in(None) is None


def test_shield_is_inherited_across_exec():
    """A shielded process's children (Ray's daemons, vLLM) survive SIGUSR1 even after ``exec``."""
    exec_sh = "os.execvp('sh', ['sh', '-c', 'kill -USR1 $$; echo alive'])"
    shielded = f"import os; from commrl.run import preempt; preempt.shield(); {exec_sh}"
    bare = f"import os, signal; signal.signal(signal.SIGUSR1, signal.SIG_DFL); {exec_sh}"
    run = [
        subprocess.run([sys.executable, "-c", s], capture_output=True, text=True) for s in (shielded, bare)
    ]
    assert run[0].returncode == 0 and run[0].stdout.strip() == "alive", run[0].stderr
    assert run[1].returncode == -signal.SIGUSR1 and run[1].stdout == ""
