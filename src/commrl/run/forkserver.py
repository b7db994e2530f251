"""A preloaded fork server for local jobs: each ``commrl`` job runs as a fork of a process that has already
imported torch, transformers, verl, MLflow and lm-eval, instead of importing them again (about 11 s of a
50 s tiny training job; README "Numbers").

Every job stays one process of its own, started for its command and gone when it ends: ``commrl train``
(or any command of ``FORKABLE``) run with ``COMMRL_FORKSERVER`` set becomes a thin client that hands its
command line, working directory, environment and standard streams (the descriptors themselves, over a
Unix socket) to the server; the server forks, and the fork runs the command exactly as ``commrl`` would
(``commrl.cli.main``), writing to the client's streams. The client forwards every signal it gets (SIGUSR1
and SIGTERM: a preemption warning; SIGINT) to the fork, waits, and ends the way the fork ended (its exit
status, or the same signal), so Snakemake, ``preemptible.sh`` and a user's ``kill`` see what they would see
without the server. If the client is killed outright (SIGKILL), the server kills the fork's process group.

The server collects no garbage and freezes what it imported before each fork (``gc.freeze``, Python's
advice for a fork without exec): the forks' collections then neither traverse nor copy those objects.

A job runs in its own process instead (the client says why on stderr) when no server answers, inside a
Slurm job (its allocation, cgroup and signals belong to that process tree), or when its environment
differs from the server's in a variable read at import time (``import_time_difference``): a fork would
carry the server's value.

    commrl forkserver run -- snakemake --cores 2      # what `make pipeline` runs
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV_VAR = "COMMRL_FORKSERVER"
"""The server's socket path, set by ``run_with_server`` for the command it runs."""

READY = "commrl forkserver: ready"
STOPPED = "commrl forkserver: stopped after"
"""What the server says on stderr when its preload is done, and when it stops (``... after N jobs``)."""

FORKABLE = frozenset({"init-store", "prepare", "pretrain", "train", "eval", "sweep", "report", "compare"})
"""Commands that may run as a fork (``verl-train`` never does: it starts Ray and verl's workers)."""

PRELOAD = (
    "torch",
    "numpy",
    "pandas",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "mlflow",
    "optuna",
    "lm_eval",
    "commrl.eval.vllm_backend:prepare_vllm",  # vLLM's CPU variables first, as an evaluation sets them
    "vllm.entrypoints.llm",
    "lm_eval.models.vllm_causallms",
    "verl.trainer.ppo.core_algos",
    "commrl.cli.train",
    "commrl.cli.pretrain",
    "commrl.cli.eval",
    "commrl.cli.sweep",
    "commrl.cli.report",
    "commrl.rl.trainer",
    "commrl.compression",
)
"""What the server imports once: a module, or ``module:function`` to call (with no arguments); an entry that
fails is skipped (its jobs import it themselves)."""

PER_JOB_ENV = frozenset(
    {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "NUMEXPR_NUM_THREADS"}
    | {"VECLIB_MAXIMUM_THREADS"}
)
"""Variables a job may set differently from the server: the fork applies them (``torch.set_num_threads``)."""

IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "LD_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "DNNL_",
    "ONEDNN_",
    "ATEN_",
    "TORCH",
    "PYTORCH_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "VLLM_",
    "CUDA_",
    "MLFLOW_",
    "XDG_",
    "HOME",
)
"""Variable prefixes that libraries read when imported (thread pools, CPU kernels, hub and cache paths)."""

_HEADER = struct.Struct("!I")
_forked = False  # True in a job the server forked: its commrl.cli.main runs the command in this process


def served_jobs(text: str) -> int | None:
    """How many jobs the server forked, from the last ``STOPPED`` line in ``text`` (its stderr or a
    command's output); None if it never said."""
    counts = re.findall(rf"^{re.escape(STOPPED)} (\d+) jobs$", text, flags=re.MULTILINE)
    return int(counts[-1]) if counts else None


def import_time_difference(server_env: Mapping[str, str], job_env: Mapping[str, str]) -> str | None:
    """The first variable read at import time whose value differs between the two environments (not one of
    ``PER_JOB_ENV``, unless the job lacks one the server has), as ``NAME``; None when a fork of the server
    is the job's own process."""
    for name in sorted(set(server_env) | set(job_env)):
        if name in PER_JOB_ENV:  # applied by the fork, but a server's value cannot be unset
            if name in server_env and name not in job_env:
                return name
            continue
        if not name.startswith(IMPORT_TIME_PREFIXES):
            continue
        if server_env.get(name) != job_env.get(name):
            return name
    return None


def python_identity() -> dict[str, str]:
    """This interpreter: its resolved executable, prefix and version (a fork runs the server's)."""
    return {
        "executable": os.path.realpath(sys.executable),
        "prefix": sys.prefix,
        "version": sys.version,
    }


def ignored_signals() -> list[int]:
    """The ``FORWARDED`` signals this process ignores (inherited as SIG_IGN: ``nohup``, a job's wrapper)."""
    return [int(signum) for signum in FORWARDED if signal.getsignal(signum) == signal.SIG_IGN]


# ---------------------------------------------------------------------------------------------- client
def submit(path: str, argv: Sequence[str]) -> int | None:
    """Run ``commrl ARGV`` as a fork of the server at ``path``; its exit status (a fork killed by a signal
    kills this process with the same signal). None when the job should run in this process instead (no
    server answers, or it refused the job: the reason is on stderr)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as err:
        print(
            f"commrl: fork server {path} not reachable ({err.strerror}); running in this process",
            file=sys.stderr,
        )
        sock.close()
        return None
    request = json.dumps(
        {
            "argv": list(argv),
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "python": python_identity(),
            "ignored": ignored_signals(),
        }
    ).encode()
    with sock:
        streams = [_valid_or_null(fd) for fd in (0, 1, 2)]
        socket.send_fds(sock, [_HEADER.pack(len(request)) + request], streams)
        for sent, fd in zip(streams, (0, 1, 2), strict=True):
            if sent != fd:
                os.close(sent)
        reader = sock.makefile("r", encoding="utf-8")
        first = _read_message(reader)
        if first is None or "refused" in first:
            reason = "it closed the connection" if first is None else first["refused"]
            print(f"commrl: fork server refused the job ({reason}); running in this process", file=sys.stderr)
            return None
        pid = int(first["pid"])
        forwarded = _forward_signals(pid)
        try:
            last = _read_message(reader)
        finally:
            for signum, handler in forwarded.items():
                signal.signal(signum, handler)
    if last is None:  # the server died: the fork's fate is unknown; do not leave it running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        print(f"commrl: the fork server died while job {pid} ran; job killed", file=sys.stderr)
        return 70
    code = os.waitstatus_to_exitcode(int(last["status"]))
    if code < 0:  # killed by a signal: end the same way, so the caller sees what it would without the server
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGQUIT)


def _forward_signals(pid: int) -> dict[int, object]:
    """Forward the ``FORWARDED`` signals to ``pid``; the previous handlers. Also those this process ignores:
    the fork ignores them too (``_run_job``) unless its job handles one, as in its own process (the
    workflow's wrapper ignores SIGUSR1, and the trainer's preemption handler takes it)."""

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    return {signum: signal.signal(signum, forward) for signum in FORWARDED}


def _valid_or_null(fd: int) -> int:
    """``fd`` if it is open, else a new descriptor on /dev/null (a job started with a stream closed)."""
    try:
        os.fstat(fd)
    except OSError:
        return os.open(os.devnull, os.O_RDWR)
    return fd


def _refuse(conn: socket.socket, why: str, fds: Sequence[int] = ()) -> None:
    """Tell the client to run its job in its own process (``why`` goes to its stderr); close what it sent."""
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"refused": why}).encode() + b"\n")
    conn.close()
    for fd in fds:
        os.close(fd)


def _read_message(reader) -> dict | None:
    line = reader.readline()
    return json.loads(line) if line else None


# ---------------------------------------------------------------------------------------------- server
class ForkServer:
    """Accepts jobs on a Unix socket and runs each as a fork; one thread, a ``select`` loop. Jobs are served
    from the start, between the imports of ``preload`` too (the first jobs need little of it)."""

    def __init__(self, path: str, parent_fd: int | None = None):
        self.path = path
        self.parent_fd = parent_fd  # a pipe's read end whose writer is the launcher: EOF, it died
        self.env = dict(os.environ)
        gc.disable()  # no collections in the server: they would leave freed holes in pages the forks share
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.jobs: dict[int, socket.socket] = {}  # fork pid -> its client's connection
        self.orphans: set[int] = set()  # forks whose client is gone: killed, not yet reaped
        self.served = 0
        self._stop = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)

    def preload(self, modules: Sequence[str] = PRELOAD) -> tuple[float, list[str]]:
        """Import ``modules`` (serving the jobs that arrive meanwhile) and open a throw-away MLflow store
        (its first open imports alembic and reads the migrations); the seconds it took and the entries
        that failed."""
        start = time.perf_counter()
        failed = []
        for name in modules:
            if self._stop:
                break
            module, _, function = name.partition(":")
            try:
                loaded = importlib.import_module(module)
                if function:
                    getattr(loaded, function)()
            except Exception:  # any failure: the job imports it itself
                failed.append(name)
            self.poll(timeout=0)
        _warm_mlflow()
        return time.perf_counter() - start, failed

    def serve(self) -> None:
        """Serve until SIGTERM or SIGINT; then the running jobs get SIGTERM (SIGKILL after 10 s)."""
        try:
            while not self._stop:
                self.poll(timeout=None)
        finally:
            self._shutdown()

    def poll(self, timeout: float | None) -> None:
        """One turn of the loop: accept a job, kill the forks of vanished clients, reap finished forks."""
        clients = [conn for pid, conn in self.jobs.items() if pid not in self.orphans]
        parent = [] if self.parent_fd is None else [self.parent_fd]
        readable, _, _ = select.select([self.listener, self._wake_r, *parent, *clients], [], [], timeout)
        if self._wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
        if self.parent_fd is not None and self.parent_fd in readable:
            self._stop = True  # nothing is written to the pipe: readable is its end, the launcher died
            os.close(self.parent_fd)
            self.parent_fd = None
        if self.listener in readable:
            self._accept()
        for pid, conn in list(self.jobs.items()):
            if conn in readable and pid not in self.orphans and not _recv_or_eof(conn):
                self._drop(pid)  # the client is gone (killed outright)
        self._reap()

    def _drop(self, pid: int) -> None:
        """The client of fork ``pid`` is gone: kill the fork's process group (reaped later)."""
        self.orphans.add(pid)
        with contextlib.suppress(OSError):  # the fork may not have made its group yet: make it here
            os.setpgid(pid, pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def _request_stop(self, signum: int, frame: object) -> None:
        self._stop = True

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:  # the client went away before it was accepted
            return
        fds: list[int] = []
        try:
            conn.settimeout(10)
            request, fds = _receive_request(conn)
            conn.settimeout(None)
            job_env, python, ignored = request["env"], request["python"], request["ignored"]
            if not (isinstance(job_env, dict) and isinstance(python, dict) and isinstance(ignored, list)):
                raise ValueError("malformed request")
        except (OSError, ValueError, KeyError, TypeError) as err:
            _refuse(conn, f"bad request: {err!r}", fds)
            return
        why = None
        if python != python_identity():
            why = f"another Python ({python.get('executable')}, {python.get('prefix')}) than the server's"
        elif (name := import_time_difference(self.env, job_env)) is not None:
            why = f"{name} differs from the server's"
        elif threading.active_count() != 1:  # a library started a thread: a fork would lose its locks' owner
            names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
            why = f"the server runs threads ({names})"
        if why is not None:
            _refuse(conn, why, fds)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # the preloaded objects: out of the forks' collections (else traversed and copied)
        try:
            pid = os.fork()
        except OSError as err:  # out of processes or memory: the job runs in its client's process
            _refuse(conn, f"fork failed: {err.strerror}", fds)
            return
        if pid == 0:
            parent = [] if self.parent_fd is None else [self.parent_fd]
            _run_job(
                request,
                fds,
                close=[self.listener, conn, *self.jobs.values()],
                close_fds=[self._wake_r, self._wake_w, *parent],
            )
        for fd in fds:
            os.close(fd)
        self.jobs[pid] = conn
        self.served += 1
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:  # the client died during its handshake
            self._drop(pid)

    def _reap(self) -> None:
        while self.jobs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.jobs.pop(pid, None)
            self.orphans.discard(pid)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                conn.close()

    def _shutdown(self) -> None:
        for pid in self.jobs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while self.jobs and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.1)
        for pid in list(self.jobs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self._reap()
        self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        gc.unfreeze()  # the interpreter's own exit collects them (extension modules count what is left)
        gc.enable()


def _recv_or_eof(conn: socket.socket) -> bytes:
    """One byte from a client's connection; empty when it closed or reset it."""
    try:
        return conn.recv(1)
    except OSError:
        return b""


def _receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    if len(data) < _HEADER.size or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("expected a length, a JSON request and three descriptors")
    try:
        (length,) = _HEADER.unpack_from(data)
        body = bytearray(data[_HEADER.size :])
        while len(body) < length:
            more = conn.recv(length - len(body))
            if not more:
                raise ValueError("request cut short")
            body += more
        request = json.loads(body)
        if not isinstance(request, dict):
            raise ValueError("the request is not an object")
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        raise
    return request, fds


def _run_job(request: dict, fds: list[int], close: list[socket.socket], close_fds: list[int]) -> None:
    """In the fork: become the job's process (its streams, directory, environment, threads), run its
    command through ``commrl.cli.main``, exit with its status. Never returns."""
    global _forked
    code = 1
    interrupted = False
    try:
        _forked = True
        gc.enable()
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, *FORWARDED):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in request["ignored"]:  # ignored in the client: ignored in its own process too
            signal.signal(signum, signal.SIG_IGN)
        for sock in close:
            sock.close()
        for fd in close_fds:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own streams
        sys.stdout = open(1, "w", encoding="utf-8", buffering=1 if os.isatty(1) else -1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # cached by the server from its TMPDIR: the job's own, on first use
        sys.argv = ["commrl", *request["argv"]]
        _apply_threads(request["env"])
        from commrl.cli.main import main

        code = int(main(request["argv"]) or 0)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:  # as the interpreter ends: the traceback, then death by SIGINT
        traceback.print_exc()
        interrupted = True
    except BaseException:  # the job's crash, printed as the interpreter would
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            code = 128 + signal.SIGINT
        os._exit(code)


def _apply_threads(env: Mapping[str, str]) -> None:
    """The job's thread counts, which the server's OpenMP and BLAS read once at their own start: torch's
    (OMP_NUM_THREADS), and OpenMP's, OpenBLAS's and MKL's through threadpoolctl where it is installed."""
    counts = {
        "openmp": _count(env, "OMP_NUM_THREADS"),
        "openblas": _count(env, "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"),
        "mkl": _count(env, "MKL_NUM_THREADS", "OMP_NUM_THREADS"),
    }
    torch = sys.modules.get("torch")
    if torch is not None and counts["openmp"] is not None:
        torch.set_num_threads(counts["openmp"])
    limits = {api: count for api, count in counts.items() if count is not None}
    if limits:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            return
        controller = ThreadpoolController()
        for api, count in limits.items():
            controller.select(internal_api=api).limit(limits=count)


def _count(env: Mapping[str, str], *names: str) -> int | None:
    """The first of ``names`` set in ``env`` to a positive integer (its first field: OpenMP's lists)."""
    for name in names:
        value = env.get(name, "").split(",")[0].strip()
        if value:
            return int(value) if value.isdigit() and int(value) > 0 else None
    return None


def _warm_mlflow() -> None:
    """Open an MLflow store in a temporary folder and let it go: the jobs' first open is then fast."""
    if "mlflow" not in sys.modules:
        return
    from commrl import tracking

    with tempfile.TemporaryDirectory(prefix="commrl-warm-") as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        with contextlib.suppress(Exception):
            tracking.client(uri).search_experiments()
            store = tracking.client(uri)._tracking_client.store
            store.engine.dispose()


def in_fork() -> bool:
    """Whether this process is a job the server forked."""
    return _forked


# ---------------------------------------------------------------------------------------------- launcher
def serve(path: str, preload: Sequence[str] = PRELOAD, parent_fd: int | None = None) -> int:
    """``commrl forkserver serve PATH``: bind, import ``preload``, say ``READY``, serve until SIGTERM (or
    the end of the pipe ``parent_fd``: its launcher died)."""
    server = ForkServer(path, parent_fd)
    try:
        seconds, failed = server.preload(preload)
    except BaseException:
        server.listener.close()
        os.unlink(path)  # clients that find no server run in their own process
        raise
    skipped = f"; not preloaded: {', '.join(failed)}" if failed else ""
    print(f"{READY} in {seconds:.1f} s at {path}{skipped}", file=sys.stderr, flush=True)
    server.serve()
    with contextlib.suppress(OSError):  # a launcher that died took the reading end of stderr with it
        print(f"{STOPPED} {server.served} jobs", file=sys.stderr, flush=True)
    return 0


class ServerProcess:
    """``commrl forkserver serve`` in a subprocess (a session of its own), on a socket in a fresh temporary
    folder; stopped by its process id. Its stderr is relayed to this process's, line by line.

        server = ServerProcess()            # or ServerProcess(preload=("commrl.rl.config",))
        server.wait(ready=True)             # False: up to the socket (jobs are served between the imports)
        ... jobs with COMMRL_FORKSERVER=server.path ...
        served = server.stop()              # how many jobs it forked
    """

    def __init__(self, preload: Sequence[str] | None = None, cwd: str | Path | None = None):
        self.folder = Path(tempfile.mkdtemp(prefix="commrl-fork-"))  # a socket path must stay < ~100 bytes
        self.path = str(self.folder / "socket")
        lifeline, self._lifeline = os.pipe()  # the server stops at its EOF: when this process is gone
        command = [sys.executable, "-m", "commrl.cli.main", "forkserver", "serve", self.path]
        command += ["--parent-fd", str(lifeline)]
        if preload is not None:
            command += ["--preload", *preload]
        try:
            self.proc = subprocess.Popen(
                command,
                cwd=cwd,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
                pass_fds=(lifeline,),
            )
        finally:
            os.close(lifeline)
        self.ready = threading.Event()
        self.served: int | None = None
        self._relay = threading.Thread(target=self._relay_stderr, daemon=True)
        self._relay.start()

    def _relay_stderr(self) -> None:
        for line in self.proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if line.startswith(READY):
                self.ready.set()
            elif (served := served_jobs(line)) is not None:
                self.served = served

    def wait(self, ready: bool = False, timeout_s: float = 60.0) -> bool:
        """Wait for the socket (``ready``: for the end of the preload); False if the server died or took
        longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not (self.ready.is_set() if ready else os.path.exists(self.path)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (SIGKILL after ``timeout_s``), then the folder is removed; the jobs it forked (None if it
        never said)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._relay.join(timeout=timeout_s)
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        shutil.rmtree(self.folder, ignore_errors=True)
        return self.served

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_with_server(command: Sequence[str], startup_timeout_s: float = 60.0) -> int:
    """Run ``command`` with a fork server up (its socket in ``COMMRL_FORKSERVER``); stop the server by its
    process id when the command ends. The command's exit status (a command killed by a signal kills this
    process with the same signal, once the server is stopped). SIGTERM and SIGHUP go to the command."""
    code = _run_beside_server(command, startup_timeout_s)
    if code < 0 and -code not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return 128 - code if code < 0 else code


def _run_beside_server(command: Sequence[str], startup_timeout_s: float) -> int:
    """``run_with_server``'s run: the command's ``Popen.returncode`` (-N: killed by signal N)."""
    with ServerProcess() as server:
        env = {name: value for name, value in os.environ.items() if name != ENV_VAR}
        if server.wait(timeout_s=startup_timeout_s):
            env[ENV_VAR] = server.path
        else:
            print("commrl forkserver: the server did not start; running without it", file=sys.stderr)
        proc = subprocess.Popen(list(command), env=env)
        previous = {
            signum: signal.signal(signum, lambda signum, frame: proc.send_signal(signum))
            for signum in (signal.SIGTERM, signal.SIGHUP)
        }
        try:
            while True:
                try:
                    return proc.wait()
                except KeyboardInterrupt:  # the terminal's SIGINT reached the command too; wait for it
                    continue
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
