"""The fork server against rude clients, ignored signals, other interpreters, a dead launcher, per-job state
and Ctrl-C (``commrl.run.forkserver``): a job through it still behaves as in its own process."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from forkserver_helpers import Server, commrl, direct_env, forks_of

from commrl.run import forkserver


def _long_job(env: dict[str, str], out: Path, **popen: object) -> subprocess.Popen:
    """``commrl prepare`` of a few seconds, its stderr captured."""
    command = [sys.executable, "-m", "commrl.cli.main", "prepare", "--dataset", "toy", "--seed", "0"]
    command += ["--n-train", "200000", "--digits", "4", "--out", str(out)]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen
    )


def _wait_for_fork(server: Server, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while not (forks := forks_of(server)):
        assert time.monotonic() < deadline, "no fork started"
        time.sleep(0.05)
    return forks


def _raw_request(server: Server, env: dict[str, str], **fields: object) -> socket.socket:
    """A client's request (``commrl prepare --help``, streams on /dev/null) sent by hand; its connection."""
    request = {
        "argv": ["prepare", "--help"],
        "cwd": "/",
        "env": env,
        "python": {
            "executable": os.path.realpath(sys.executable),
            "prefix": sys.prefix,
            "version": sys.version,
        },
        "ignored": [],
        **fields,
    }
    body = json.dumps(request).encode()
    null = os.open(os.devnull, os.O_RDWR)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(server.path)
    socket.send_fds(sock, [struct.pack("!I", len(body)) + body], [null, null, null])
    os.close(null)
    return sock


def test_clients_that_die_in_their_handshake_leave_the_server_and_its_jobs_running(server, tmp_path):
    good = _long_job(server.env(), tmp_path / "good")
    _wait_for_fork(server)
    before_reply = _raw_request(server, server.env())
    before_reply.close()  # gone before the server answers with the fork's pid
    after_reply = _raw_request(server, server.env())
    assert b"pid" in after_reply.recv(100)
    after_reply.close()  # gone while its job runs
    _, err = good.communicate(timeout=120)
    assert good.returncode == 0, err
    assert "refused" not in err
    nxt = commrl("train", "--cfg", "pair=tiny", env=server.env(), cwd=tmp_path)
    assert nxt.returncode == 0 and "pair: tiny" in nxt.stdout and "refused" not in nxt.stderr
    assert server.proc.poll() is None
    assert server.stop() >= 3


def _ignore_hup_and_usr1() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _default_hup_and_int() -> None:
    """SIGHUP and SIGINT as in a terminal's foreground job: a test run under nohup or in a background job
    inherits them ignored, and a client that ignores a signal passes the ignore on to its job."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_signals_the_client_ignores_are_ignored_by_its_job(server, tmp_path):
    client = _long_job(server.env(), tmp_path / "out", preexec_fn=_ignore_hup_and_usr1)
    (fork,) = _wait_for_fork(server)
    time.sleep(0.5)
    for pid in (client.pid, fork):  # to the client (forwarded) and to the job itself: ignored by the job
        for signum in (signal.SIGHUP, signal.SIGUSR1):
            os.kill(pid, signum)
    _, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    assert server.stop() == 1


def test_a_client_of_another_python_is_refused(server):
    elsewhere = {"executable": sys.executable, "prefix": "/elsewhere", "version": sys.version}
    sock = _raw_request(server, server.env(), python=elsewhere)
    reply = json.loads(sock.makefile("r").readline())
    sock.close()
    assert "another Python" in reply["refused"] and "/elsewhere" in reply["refused"]
    assert server.stop() == 0


LAUNCHER = """
import sys
from commrl.run import forkserver as fs
fs.ServerProcess.__init__.__defaults__ = (("json",), None)
sys.exit(fs.run_with_server(sys.argv[1:]))
"""


def _server_pid(socket_path: str) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in cmdline and socket_path.encode() in cmdline:
                return int(entry)
    raise AssertionError("no server process")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_server_stops_when_its_launcher_is_killed(tmp_path):
    command = ["sh", "-c", f'echo "${forkserver.ENV_VAR}"; exec sleep 60']
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    socket_path = launcher.stdout.readline().strip()
    assert socket_path
    pid = _server_pid(socket_path)
    children = [p for p in _children(launcher.pid) if p != pid]
    launcher.kill()
    launcher.wait()
    for child in children:  # the command (sleep), orphaned
        os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
    assert not os.path.exists(socket_path)


def _children(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                pids.append(int(entry))
    return pids


def test_the_launcher_ends_as_its_command_does_under_sighup_and_signals(tmp_path):
    script = f"trap 'kill $!; exit 7' HUP; echo \"${forkserver.ENV_VAR}\"; sleep 60 & wait"
    hung_up = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, "sh", "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_default_hup_and_int,
    )
    assert hung_up.stdout.readline().strip()
    time.sleep(0.5)  # the launcher's handlers are in place once the command runs
    hung_up.send_signal(signal.SIGHUP)  # forwarded to the command, whose status the launcher returns
    assert hung_up.wait(timeout=60) == 7
    killed = subprocess.run([sys.executable, "-c", LAUNCHER, "sh", "-c", "kill -TERM $$"], timeout=60)
    assert killed.returncode == -signal.SIGTERM  # as the plain command's


PROBE_SERVER = """
import os, sys, tempfile
import commrl.cli.main as cli

def probe(argv):
    import numpy, threadpoolctl
    blas = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]
    print(f"tmp={tempfile.gettempdir()} blas={blas}")
    return 0

if sys.argv[1] == "alone":
    sys.exit(probe([]))
cli.main = probe
from commrl.run import forkserver
sys.exit(forkserver.serve(sys.argv[1], ("numpy", "threadpoolctl", "tempfile:gettempdir")))
"""


def test_a_fork_takes_the_jobs_temporary_folder_and_blas_threads(tmp_path):
    script = tmp_path / "probe_server.py"
    script.write_text(PROBE_SERVER)
    path = str(tmp_path / "s")
    server_env = {k: v for k, v in direct_env().items() if not k.endswith("_NUM_THREADS") and k != "TMPDIR"}
    server = subprocess.Popen(
        [sys.executable, str(script), path], env=server_env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert forkserver.READY in server.stderr.readline()
        (tmp_path / "jobtmp").mkdir()
        job_env = {**server_env, "TMPDIR": str(tmp_path / "jobtmp"), "OPENBLAS_NUM_THREADS": "1"}
        alone = subprocess.run(
            [sys.executable, str(script), "alone"], env=job_env, capture_output=True, text=True
        )
        code = (
            f"from commrl.run import forkserver as fs; import sys; sys.exit(fs.submit({path!r}, ['train']))"
        )
        forked = subprocess.run([sys.executable, "-c", code], env=job_env, capture_output=True, text=True)
        assert forked.returncode == 0 and forked.stderr == "", forked.stderr
        assert forked.stdout == alone.stdout
        assert f"tmp={tmp_path / 'jobtmp'} blas=[1]" in forked.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_home_and_xdg_variables_are_import_time_and_an_unset_thread_count_differs():
    server = {"HOME": "/root", "XDG_CACHE_HOME": "/c", "OPENBLAS_NUM_THREADS": "2"}
    assert forkserver.import_time_difference(server, {**server, "XDG_CACHE_HOME": "/d"}) == "XDG_CACHE_HOME"
    assert forkserver.import_time_difference(server, {**server, "HOME": "/home/u"}) == "HOME"
    assert forkserver.import_time_difference(server, {**server, "OPENBLAS_NUM_THREADS": "1"}) is None
    job = {"HOME": "/root", "XDG_CACHE_HOME": "/c"}
    assert forkserver.import_time_difference(server, job) == "OPENBLAS_NUM_THREADS"


def test_ctrl_c_kills_a_forked_job_with_sigint_and_a_traceback(server, tmp_path):
    client = _long_job(server.env(), tmp_path / "out", preexec_fn=_default_hup_and_int)
    _wait_for_fork(server)
    time.sleep(1.0)
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=120)
    assert client.returncode == -signal.SIGINT
    assert "KeyboardInterrupt" in err and "Traceback" in err
    assert server.stop() == 1


FAILING_FORK = """
import errno, os, sys
from commrl.run import forkserver

def no_fork():
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))

os.fork = no_fork
sys.exit(forkserver.serve(sys.argv[1], preload=()))
"""


def test_a_failed_fork_runs_the_job_in_its_clients_process_and_the_server_serves_on(tmp_path):
    path = str(tmp_path / "socket")
    proc = subprocess.Popen(
        [sys.executable, "-c", FAILING_FORK, path], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert forkserver.READY in proc.stderr.readline()
        env = {**direct_env(), forkserver.ENV_VAR: path}
        for _ in range(2):
            done = commrl("prepare", "--help", env=env)
            assert done.returncode == 0 and "--dataset" in done.stdout
            assert "refused the job (fork failed: Resource temporarily unavailable)" in done.stderr
            assert "running in this process" in done.stderr
        assert proc.poll() is None
    finally:
        proc.terminate()
    assert proc.wait(timeout=30) == 0


FORWARD_IGNORED = """
import os, signal, subprocess, sys, time
from commrl.run import forkserver

signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the workflow's wrapper: the client inherits SIG_IGN
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
time.sleep(1.0)  # the child's handler is installed
forkserver._forward_signals(child.pid)
os.kill(os.getpid(), signal.SIGUSR1)
sys.exit(child.wait(timeout=30))
"""
HANDLES_USR1 = """
import signal, sys, time
from pathlib import Path

def handle(signum, frame):
    Path(sys.argv[1]).write_text("usr1")
    sys.exit(0)

signal.signal(signal.SIGUSR1, handle)
time.sleep(30)
sys.exit(3)
"""


def test_a_signal_the_client_ignores_still_reaches_a_job_that_handles_it(tmp_path):
    """The trainer's preemption handler takes SIGUSR1 (``kill -USR1``: checkpoint and stop) although the
    workflow's wrapper, and so the client, ignores it: the client forwards it all the same."""
    mark = tmp_path / "usr1"
    done = subprocess.run(
        [sys.executable, "-c", FORWARD_IGNORED, HANDLES_USR1, str(mark)], timeout=60, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    assert mark.read_text() == "usr1"
