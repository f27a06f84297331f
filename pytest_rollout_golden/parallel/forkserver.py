"""A fork server: one helper process per test process that has imported torch once and forks
``torch.distributed`` ranks on request (Linux, gloo).

A new worker pool then costs a ``fork`` and a gloo rendezvous instead of N interpreter starts
and N torch imports. The server is a plain interpreter (started like the spawned workers, so
an unguarded ``__main__`` is never re-run) that imports torch, ``torch.distributed``, pytest
and the reference policy, checks it is still **single-threaded** (no OpenMP, OpenBLAS or
gloo thread, no process group, no CUDA: it never computes anything) and then only forks.
Its environment sets ``OPENBLAS_NUM_THREADS=1``, since numpy's OpenBLAS starts a thread pool
at import otherwise; each rank restores the test process's environment, ``sys.path``,
working directory and standard streams of the moment its pool starts, reseeds ``random``
(and numpy's global generator), and runs exactly what a spawned worker runs: every task
then takes on the environment, ``sys.path`` and working directory of the launch that sent
it (:func:`adopt`).

Lifetimes: the server dies with the test process (``PR_SET_PDEATHSIG``, and end of file on
its socket, which it checks between requests); each rank dies with the server
(``PR_SET_PDEATHSIG``) and with the test process (the pool's lifeline pipe, as a spawned
worker does), and runs in a process group of its own that the server kills, together with
anything the rank started, when told to stop it or when the server itself stops. Each rank's
guardian (:func:`die_with_parent`) kills that group when the test process or the rank is
gone, even when the kernel killed the server and the rank at once. The server
is the ranks' parent, so it reaps them and reports their exit codes: no process id is ever
signalled after it was reaped.

Requests and replies are pickled tuples over a ``SOCK_SEQPACKET`` socket pair between the two
processes; the pipes of a rank travel with the request (``SCM_RIGHTS``). Nothing read from
disk is unpickled.

The last part of this module is what every rank runs, forked or spawned by the launcher:
:func:`die_with_parent`, then :func:`worker_main` over a :class:`Channel`.

``ROLLOUT_GOLDEN_FORKSERVER=0`` turns the server off (every rank is then a fresh interpreter,
as on other systems than Linux and for NCCL, where each rank initialises CUDA itself).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import pickle
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Sequence
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

ENV_VAR = "ROLLOUT_GOLDEN_FORKSERVER"
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.fx.experimental.symbolic_shapes",  # (and sympy) imported by backward(gradient)
    "pytest",
    "pytest_rollout_golden.parallel.policy",
)
"""Modules the server imports before it forks: what a rank of the reference policy needs
(a pipeline stage's first ``backward(gradient)`` imports ``symbolic_shapes``: 0.6 s)."""
MAX_MESSAGE = 1 << 20
START_TIMEOUT = 120.0
STATE: dict[str, Any] = {}  # in a rank: the backend it joined with
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class ServerError(RuntimeError):
    """The fork server could not start, died, did not answer (``lost``) or refused a request."""

    def __init__(self, message: str, *, lost: bool = True):
        super().__init__(message)
        self.lost = lost


def enabled() -> bool:
    """Whether pools of gloo ranks are forked by the server (Linux, unless turned off)."""
    return sys.platform.startswith("linux") and os.environ.get(ENV_VAR, "1") != "0"


# ---------------------------------------------------------------------- the test process side

_SERVER: Server | None = None
_BROKEN: str | None = None  # why the server failed in this process: not started again
_LOCK = threading.Lock()


def server() -> Server | None:
    """The running server of this process, started on first use; None when it is off or
    failed to start once in this process (the launcher then spawns interpreters)."""
    global _SERVER
    if not enabled() or _BROKEN is not None:
        return None
    with _LOCK:
        if _SERVER is not None and _SERVER.owner != os.getpid():  # inherited by a fork of ours
            _SERVER = None  # its parent's; this process starts its own
        if _SERVER is None or not _SERVER.running():
            if _SERVER is not None:
                _SERVER.close()
            _SERVER = Server()
        return _SERVER


def replace(failed: Server, error: ServerError, *, retry: bool) -> Server | None:
    """After ``failed`` raised ``error``: a fresh server if ``retry`` and the failed one was
    lost after it had started (killed since); else None for the rest of this process, with a
    warning (the launcher then spawns interpreters)."""
    global _BROKEN, _SERVER
    failed.close()
    with _LOCK:
        if _SERVER is failed:
            _SERVER = None
    if retry and error.lost and failed.ready:
        return server()
    lines = str(error).strip().splitlines() or [type(error).__name__]
    _BROKEN = lines[0].rstrip(":") + (f": {lines[-1]}" if len(lines) > 1 else "")
    warnings.warn(
        f"rollout-golden: the fork server failed ({_BROKEN}); every rank of this process is "
        f"now a fresh interpreter (slower); set {ENV_VAR}=0 to skip the server",
        RuntimeWarning,
        stacklevel=2,
    )
    return None


def stop() -> None:
    """Stop the server of this process (its ranks die with it)."""
    global _SERVER
    with _LOCK:
        if _SERVER is not None and _SERVER.owner == os.getpid():
            _SERVER.close()
        _SERVER = None


def server_pid() -> int | None:
    """Process id of this process's running server, if any (to observe it)."""
    current = _SERVER
    if current is None or current.owner != os.getpid() or not current.running():
        return None
    return current.pid


class Server:
    """The test process's handle on its fork server: start it, fork ranks, poll, stop."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        env["OPENBLAS_NUM_THREADS"] = "1"  # else numpy's OpenBLAS starts threads at import
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _SERVER_COMMAND, str(theirs.fileno()), str(os.getpid())],
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # out of Ctrl-C's reach: pytest stops it
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pid = self.process.pid
        self.owner = os.getpid()
        self.sock: socket.socket | None = ours
        self.ready = False
        self.requests = itertools.count(1)  # 0: its start
        self.lock = threading.Lock()

    def running(self) -> bool:
        return self.sock is not None and self.process.poll() is None

    def fork(
        self, rank: int, world_size: int, backend: str, port: int, fds: tuple[int, int, int]
    ) -> int:
        """Fork one rank; ``fds`` are its ends of the task pipe, reply pipe and lifeline."""
        stdio = [fd for fd in (0, 1, 2) if _is_open(fd)]
        request = ("fork", rank, world_size, backend, port, *surroundings(), stdio)
        return int(self.request(request, [*fds, *stdio]))

    def poll(self, pids: list[int]) -> list[int | None]:
        """Exit code of each rank (``-signal`` when killed), None while it runs."""
        codes = self.request(("poll", pids))
        return [codes[pid] for pid in pids]

    def stop(self, pids: list[int], grace: float) -> None:
        """Ask the server to stop these ranks: ``grace`` s to exit, then their groups are killed."""
        self.request(("stop", pids, grace), timeout=grace + 15.0)

    def request(
        self, message: tuple[Any, ...], fds: Sequence[int] = (), timeout: float = 30.0
    ) -> Any:
        """Send ``message`` (with ``fds``), return the server's answer to it. Every request
        carries an id the reply repeats: the late reply to an interrupted request is skipped."""
        with self.lock:
            if self.sock is None:
                raise ServerError("the fork server was stopped")
            try:
                if not self.ready:
                    status, payload = self._receive(0, START_TIMEOUT, "start")
                    if status != "ready":
                        raise ServerError(f"it could not start:\n{payload}")
                    self.ready = True
                number = next(self.requests)
                socket.send_fds(self.sock, [pickle.dumps((number, *message))], list(fds))
                status, payload = self._receive(number, timeout, message[0])
            except ServerError:
                self.close()
                raise
            except OSError as exc:
                self.close()
                raise ServerError(f"lost the fork server: {type(exc).__name__}: {exc}") from None
        if status != "ok":
            raise ServerError(f"{message[0]} failed in the fork server:\n{payload}", lost=False)
        return payload

    def _receive(self, number: int, timeout: float, what: str) -> tuple[str, Any]:
        assert self.sock is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise ServerError(f"the fork server did not answer {what!r} within {timeout:g} s")
            data = self.sock.recv(MAX_MESSAGE)
            if not data:
                try:  # its socket closes just before it exits
                    code = self.process.wait(2.0)
                except subprocess.TimeoutExpired:
                    code = None
                raise ServerError(f"the fork server exited (exit code {code}) during {what!r}")
            answered, status, payload = pickle.loads(data)
            if answered == number:
                return status, payload

    def close(self) -> None:
        """Stop the server: end of file on its socket; killed if it lingers."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        try:
            self.process.wait(2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5.0)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------- the server process

_SERVER_COMMAND = "from pytest_rollout_golden.parallel.forkserver import _serve; _serve()"


def thread_count() -> int:
    """Threads of this process (Linux)."""
    return len(os.listdir("/proc/self/task"))


def _serve() -> None:
    """Entry point of the server (arguments in ``sys.argv``, see :class:`Server`)."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    parent = int(sys.argv[2])
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the test process died before the signal was armed
        os._exit(1)
    try:
        for name in PRELOAD:
            __import__(name)
        problem = _unfit_to_fork()
        if problem:
            raise RuntimeError(problem)
    except BaseException:
        _reply(sock, 0, "error", traceback.format_exc())
        os._exit(1)
    _reply(sock, 0, "ready", os.getpid())
    children: dict[int, int | None] = {}  # forked ranks: exit code once reaped
    try:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
            except OSError:
                break
            if not data:
                break  # the test process closed its end, or died
            number, op, *args = pickle.loads(data)
            try:
                if op == "fork":
                    payload: Any = _fork(sock, args, fds, children)
                elif op == "poll":
                    payload = {pid: _reap(pid, children) for pid in args[0]}
                else:
                    payload = _stop(args[0], args[1], children)
            except Exception:
                _reply(sock, number, "error", traceback.format_exc())
            else:
                _reply(sock, number, "ok", payload)
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        _stop(list(children), 0.0, children)
        os._exit(0)


def _reply(sock: socket.socket, number: int, status: str, payload: Any) -> None:
    sock.send(pickle.dumps((number, status, payload)))


def _unfit_to_fork() -> str:
    """Why this process must not fork ranks, or ''."""
    import torch
    import torch.distributed as dist

    threads = thread_count()
    if threads != 1:
        return f"the fork server runs {threads} threads (forking is safe from one only)"
    if dist.is_available() and dist.is_initialized():
        return "the fork server joined a process group"
    if torch.cuda.is_initialized():
        return "the fork server initialised CUDA"
    return ""


def _fork(
    sock: socket.socket, args: list[Any], fds: list[int], children: dict[int, int | None]
) -> int:
    rank, world_size, backend, port, env, path, cwd, stdio = args
    problem = _unfit_to_fork()
    if problem:
        raise RuntimeError(problem)
    server = os.getpid()
    pid = os.fork()
    if pid:
        children[pid] = None
        return pid
    code = 1
    try:  # the rank: never returns into the server's loop
        sock.close()
        os.setsid()  # a process group of its own, which the server kills with it
        from_parent, to_parent, lifeline = fds[:3]
        for target, fd in zip(stdio, fds[3:], strict=True):
            os.dup2(fd, target)
        for fd in fds[3:]:
            os.close(fd)
        adopt((env, path, cwd))
        random.seed()
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is not None:
            numpy_random.seed()
        die_with_parent(server, lifeline)
        worker_main(Channel(to_parent, from_parent), rank, world_size, backend, port)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap(pid: int, children: dict[int, int | None], block: bool = False) -> int | None:
    """Exit code of child ``pid`` (reaped now if it exited), None while it runs."""
    if pid not in children:  # reaped and forgotten, or never ours: gone
        return -int(signal.SIGKILL)
    if children[pid] is not None:
        return children[pid]
    try:
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        children[pid] = -int(signal.SIGKILL)
        return children[pid]
    if done == 0:
        return None
    children[pid] = os.waitstatus_to_exitcode(status)
    return children[pid]


def _stop(pids: list[int], grace: float, children: dict[int, int | None]) -> dict[int, Any]:
    """Wait up to ``grace`` s for the ranks to exit, then kill their process groups; forget
    them once reaped."""
    deadline = time.monotonic() + grace
    while any(_reap(pid, children) is None for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.005)
    for pid in pids:
        if _reap(pid, children) is None:  # not reaped: its id is still its own group's
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _reap(pid, children, block=True)
    return {pid: children.pop(pid, None) for pid in pids}


# ---------------------------------------------------------------------- every rank, forked or not


def surroundings() -> tuple[dict[str, str], list[str], str]:
    """This process's environment, ``sys.path`` and working directory, which every rank takes
    on for each task (:func:`adopt`)."""
    return dict(os.environ), list(sys.path), os.getcwd()


def adopt(context: tuple[dict[str, str], list[str], str]) -> None:
    """Take on the environment, ``sys.path`` and working directory :func:`surroundings`
    returned in the test process, whatever an earlier task left."""
    env, path, cwd = context
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = path
    os.chdir(cwd)


class Channel:
    """Both directions of the pipe pair between the test process and one worker."""

    def __init__(self, write_fd: int, read_fd: int):
        self.writer = Connection(write_fd, readable=False)
        self.reader = Connection(read_fd, writable=False)

    def send(self, data: bytes) -> None:
        self.writer.send_bytes(data)

    def recv(self) -> bytes:
        return self.reader.recv_bytes()

    def close(self) -> None:
        self.writer.close()
        self.reader.close()


def die_with_parent(parent: int, lifeline: int) -> None:
    """End this worker, and whatever it started, soon after process ``parent`` dies."""
    if hasattr(os, "fork") and os.getpgrp() == os.getpid():  # a group of its own
        _start_guardian(lifeline)
    if sys.platform.startswith("linux"):
        # The kernel's signal works while a rank holds the GIL. It follows the parent
        # *thread*: a pool started from a thread that ends dies with it and is restarted.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    if os.getppid() != parent:  # it died before either watch began
        _end_process_group()


def _start_guardian(lifeline: int) -> None:
    """Fork the process that kills this worker's group, the processes the rank started
    included, once the test process (end of file on ``lifeline``) or this worker is gone.

    The rank itself cannot be trusted with it: the kernel's ``PR_SET_PDEATHSIG`` kills it
    at once, before its own watch can kill the group. Forked while this process is still
    single-threaded; the guardian holds no GIL the rank could keep.
    """
    rank = os.getpid()
    rank_gone, rank_alive = os.pipe()  # end of file once the rank (and its forks) exit
    if os.fork():
        os.close(rank_gone)
        return  # rank_alive stays open, unread, for the rank's life
    try:
        os.close(rank_alive)
        _guard(rank, lifeline, rank_gone)
    finally:
        os._exit(0)


def _guard(rank: int, lifeline: int, rank_gone: int) -> None:
    """The guardian's life: hold nothing of the rank's, wait, kill the group."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    low, high = sorted((lifeline, rank_gone))
    os.closerange(3, low)
    os.closerange(low + 1, high)
    os.closerange(high + 1, os.sysconf("SC_OPEN_MAX"))
    watched = [lifeline, rank_gone]
    # Polled too: a process the rank forked may hold the rank's end of the pipe.
    while os.getppid() == rank:
        ready, _, _ = select.select(watched, [], [], 1.0)
        if any(not os.read(fd, 1) for fd in ready):
            break
    os.killpg(0, signal.SIGKILL)


def _watch_lifeline(lifeline: int) -> None:
    """Block until the parent's end of the pipe closes, then end this worker's group."""
    with contextlib.suppress(OSError):
        while os.read(lifeline, 1):
            pass
    _end_process_group()


def _end_process_group() -> None:
    if os.getpgrp() == os.getpid():  # a group of its own, as the pool starts it
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def worker_main(conn: Channel, rank: int, world_size: int, backend: str, port: int) -> None:
    """Body of every rank, forked or spawned: join the process group, then run tasks until told
    to stop."""
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # N ranks share the machine's cores
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=START_TIMEOUT),
        )
        STATE["backend"] = backend
    except BaseException:
        conn.send(pickle.dumps((0, "error", traceback.format_exc())))
        return
    conn.send(pickle.dumps((0, "ok", pickle.dumps(os.getpid()))))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            break
        if not task:
            break
        call, context, body = pickle.loads(task)
        try:
            adopt(context)
            fn, args = pickle.loads(body)
            reply = (call, "ok", pickle.dumps(fn(rank, *args)))
        except BaseException:
            reply = (call, "error", traceback.format_exc())
        conn.send(pickle.dumps(reply))
    dist.destroy_process_group()
