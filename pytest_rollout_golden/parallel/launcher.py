"""Run ``fn(rank, *args)`` on N ``torch.distributed`` ranks and return what every rank returned.

Worker processes are started once per world size and reused by every later :func:`launch`
of the session: starting a Python process and importing torch costs seconds, training the
tiny reference policy milliseconds. On Linux the gloo ranks of a new pool are forked by this
process's fork server (:mod:`.forkserver`, started by the first launch), which imported
torch once, so a new pool costs a fork and a rendezvous; NCCL ranks (each initialises CUDA,
which a fork cannot share), other systems and ``ROLLOUT_GOLDEN_FORKSERVER=0`` start one
fresh interpreter per rank. At most :data:`MAX_WORKERS` idle workers are kept (the
least recently used pool is stopped first). A pool whose ranks failed or hung, whose replies
could not be read, or whose call was interrupted (a timeout plugin, Ctrl-C) is killed and
started afresh on the next launch, since its process group is in an unknown state; every
reply also names the call it answers, so no call ever takes an earlier call's results. A
reused worker runs each call in the environment variables, ``sys.path`` and working
directory this process has at that call, never what an earlier test (or task) left. Each
worker joins one process group at start (gloo on CPU; NCCL when every rank has its own
CUDA device) through a rendezvous on a free TCP port of 127.0.0.1.

Under ``torchrun`` (``WORLD_SIZE``, ``RANK`` and ``MASTER_ADDR`` set) nothing is spawned:
:func:`launch` joins the process group torchrun set up, runs ``fn`` for this process's rank
and exchanges the results, so every process sees the results of all ranks.

Workers die with the process that started them, even while a rank is stuck: each runs in
its own process group, which it kills when a pipe from that process reaches end of file,
and on Linux the kernel also kills it when its parent dies (``PR_SET_PDEATHSIG``): the test
process, or for a forked rank the fork server, which itself dies with the test process.
Since that signal kills a rank before it could kill its group, a small guardian process
forked by each rank kills the group, and with it whatever the rank started, once the test
process or the rank is gone.

``fn`` and ``args`` travel to the workers, and results back, through pickle over a pipe
between processes of this session (by reference for ``fn``: it must be importable). Nothing
read from disk is ever unpickled.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

from . import forkserver
from .environment import torchrun_rank
from .layout import Layout

DEFAULT_TIMEOUT = 120.0
START_TIMEOUT = forkserver.START_TIMEOUT
GRACE_AFTER_FAILURE = 3.0  # other ranks may finish, or sit in a collective forever
MAX_WORKERS = int(os.environ.get("ROLLOUT_GOLDEN_MAX_WORKERS", "6"))
"""Idle worker processes kept per pytest process (each xdist worker has its own); beyond
this, the least recently used pool is stopped before a new one starts."""


class LaunchError(RuntimeError):
    """A rank raised, died or never answered; the message holds every rank's traceback."""


class LaunchTimeout(LaunchError):
    """Some ranks did not return within the timeout; ``hung`` lists them."""

    def __init__(self, message: str, hung: list[int]):
        super().__init__(message)
        self.hung = hung


def callable_name(fn: Any) -> str:
    """``fn``'s qualified name; a ``functools.partial`` is named after what it wraps."""
    if isinstance(fn, functools.partial):
        return f"functools.partial({callable_name(fn.func)}, ...)"
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _require_importable(fn: Any) -> None:
    """TypeError unless the workers can receive ``fn``: pickled by reference, so defined at
    the top level of an importable module (a partial of such a function included)."""
    base = fn
    while isinstance(base, functools.partial):
        base = base.func
    qualname = getattr(base, "__qualname__", "") or ""
    if getattr(base, "__module__", None) == "__main__" or "<locals>" in qualname:
        raise TypeError(
            f"launch({callable_name(fn)}): workers import fn by name, so it must be defined at "
            "the top level of an importable module (not in __main__ or inside a function)"
        )
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise TypeError(
            f"launch({callable_name(fn)}): fn must be picklable to reach the workers "
            f"({type(exc).__name__}: {exc})"
        ) from None


def launch(
    fn: Callable[..., Any],
    layout_or_world_size: Layout | int,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Any]:
    """``[fn(0, *args), ..., fn(N - 1, *args)]``, each computed on its own rank.

    ``N`` is the layout's world size. World size 1 runs ``fn(0, *args)`` in this process,
    without a process group. A rank that raises fails the launch with its full traceback; a
    rank that has not returned after ``timeout`` seconds gets every worker killed and a
    :class:`LaunchTimeout` naming the hung ranks (a collective one rank never enters fails,
    it does not hang). A result this process cannot unpickle fails the launch as a
    :class:`LaunchError` naming the rank. Under torchrun, a world size other than torchrun's
    (and other than 1) skips the calling test.
    """
    world_size = (
        layout_or_world_size.world_size
        if isinstance(layout_or_world_size, Layout)
        else int(layout_or_world_size)
    )
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if world_size == 1:
        _prestart()
        return [fn(0, *args)]
    _require_importable(fn)
    if under_torchrun():
        return _launch_torchrun(fn, world_size, args, timeout)
    pool = _POOLS.pop(world_size, None)
    if pool is None or not pool.alive():
        if pool is not None:
            pool.close()
        while _POOLS and sum(_POOLS) + world_size > MAX_WORKERS:
            _POOLS.pop(next(iter(_POOLS))).close()  # the least recently used pool
        pool = _Pool(world_size)
    _POOLS[world_size] = pool  # most recently used last
    try:
        return pool.run(fn, args, timeout)
    except BaseException:  # failed, hung, unreadable or interrupted: replies may be unread
        _POOLS.pop(world_size, None)
        pool.close()
        raise


def _prestart() -> None:
    """Start the fork server in the background at a world-size-1 launch: variants usually
    follow their reference, and their first pool then finds the server ready."""
    if under_torchrun() or forkserver.STATE or not forkserver.enabled():
        return  # torchrun spawns nothing; a rank never starts a server of its own
    if _backend(2) == "gloo":
        with contextlib.suppress(OSError):  # the first pool says why, or spawns
            forkserver.server()


def under_torchrun() -> bool:
    """Whether this process is one rank of a job torchrun (or a similar launcher) started."""
    return torchrun_rank() is not None


def shutdown(*, server: bool = False) -> None:
    """Stop every worker pool of this process (also done at the end of a session), and with
    ``server=True`` its fork server, which otherwise idles until this process exits (an
    in-process pytest run then reuses it)."""
    while _POOLS:
        _, pool = _POOLS.popitem()
        pool.close()
    if server:
        forkserver.stop()


def pool_pids() -> dict[int, list[int]]:
    """Process ids of the live worker pools, by world size (to observe reuse)."""
    return {n: list(pool.pids) for n, pool in _POOLS.items()}


def server_pid() -> int | None:
    """Process id of this process's fork server while it runs (see :mod:`.forkserver`)."""
    return forkserver.server_pid()


def device() -> Any:
    """The torch device of this rank: its own CUDA device under NCCL, else the CPU."""
    import torch

    if forkserver.STATE.get("backend") == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _backend(world_size: int) -> str:
    import torch

    usable = torch.cuda.is_available() and torch.cuda.device_count() >= world_size
    return "nccl" if usable else "gloo"


# ---------------------------------------------------------------------- worker pools

_POOLS: dict[int, _Pool] = {}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Pool:
    """N worker processes that joined one process group; runs one function at a time.

    Gloo ranks on Linux are forked by this process's fork server (:mod:`.forkserver`), which
    reaps them; otherwise each rank is a fresh interpreter started here.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.pids: list[int] = []
        self.spawned: list[subprocess.Popen[bytes]] = []  # the ranks, unless forked
        self.server: forkserver.Server | None = None  # the ranks' parent, if forked
        self.conns: list[forkserver.Channel] = []
        self.lifeline: int | None = None
        self.calls = itertools.count(1)  # call 0: the start
        backend = _backend(world_size)
        last_error = ""
        try:
            for _ in range(2):  # a free port can be taken between picking and binding it
                self._start(backend, _free_port())
                try:
                    self._gather(0, pickle.loads, START_TIMEOUT, what="start")
                    return
                except LaunchError as exc:
                    last_error = str(exc)
                    self.close()
        except BaseException:
            self.close()
            raise
        raise LaunchError(f"could not start {world_size} workers: {last_error}")

    def _start(self, backend: str, port: int) -> None:
        lifeline, self.lifeline = os.pipe()  # never written: end of file when this process dies
        try:
            # NCCL ranks initialise CUDA, which a forked process cannot share: spawned.
            self.server = forkserver.server() if backend == "gloo" else None
            for rank in range(self.world_size):
                to_child, from_parent = os.pipe()[::-1]
                from_child, to_parent = os.pipe()
                try:
                    pid = self._start_rank(rank, backend, port, (from_parent, to_parent, lifeline))
                finally:
                    os.close(from_parent)
                    os.close(to_parent)
                self.pids.append(pid)
                self.conns.append(forkserver.Channel(to_child, from_child))
        finally:
            os.close(lifeline)

    def _start_rank(self, rank: int, backend: str, port: int, fds: tuple[int, int, int]) -> int:
        retry = True
        while self.server is not None:
            try:
                return self.server.fork(rank, self.world_size, backend, port, fds)
            except forkserver.ServerError as exc:
                if rank:  # the ranks forked so far died with it
                    raise LaunchError(f"lost the fork server while starting ranks: {exc}") from None
                self.server = forkserver.replace(self.server, exc, retry=retry)  # or spawn
                retry = False
        # A plain interpreter rather than multiprocessing's spawn: spawn re-runs the
        # caller's __main__ in every worker, which an unguarded script does not survive.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        command = [sys.executable, "-c", _WORKER_COMMAND]
        command += [str(a) for a in (*fds, os.getpid(), rank, self.world_size, backend, port)]
        process = subprocess.Popen(
            command,
            env=env,
            pass_fds=fds,
            start_new_session=True,  # its own process group, out of Ctrl-C's reach
        )
        self.spawned.append(process)
        return process.pid

    def _exit_codes(self) -> list[int | None]:
        """Each rank's exit code (``-signal`` when killed), None while it runs."""
        if self.server is None:
            return [p.poll() for p in self.spawned]
        try:
            return self.server.poll(self.pids)
        except forkserver.ServerError:  # the server died, and its ranks with it
            return [-int(signal.SIGKILL)] * len(self.pids)

    def alive(self) -> bool:
        return all(code is None for code in self._exit_codes())

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> list[Any]:
        call = next(self.calls)
        task = pickle.dumps((call, forkserver.surroundings(), pickle.dumps((fn, args))))
        for conn in self.conns:
            conn.send(task)
        return self._gather(call, pickle.loads, timeout, what=callable_name(fn))

    def _gather(
        self, call: int, decode: Callable[[Any], Any], timeout: float, *, what: str
    ) -> list[Any]:
        pending = {conn.reader: rank for rank, conn in enumerate(self.conns)}
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while pending:
            now = time.monotonic()
            if errors:
                deadline = min(deadline, now + GRACE_AFTER_FAILURE)
            if now >= deadline:
                break
            for reader in wait(list(pending), deadline - now):
                rank = pending[reader]
                try:
                    answered, status, payload = pickle.loads(self.conns[rank].recv())
                except (EOFError, OSError):
                    code = self._exit_codes()[rank]
                    errors[rank] = f"the process exited (exit code {code}) without a result"
                    del pending[reader]
                    continue
                except Exception as exc:
                    errors[rank] = f"its reply could not be read: {type(exc).__name__}: {exc}"
                    del pending[reader]
                    continue
                if answered != call:
                    continue  # the reply to an earlier call, never this one's
                del pending[reader]
                if status != "ok":
                    errors[rank] = payload
                    continue
                try:
                    results[rank] = decode(payload)
                except Exception as exc:
                    errors[rank] = (
                        f"its result could not be unpickled in the test process: "
                        f"{type(exc).__name__}: {exc} (return types both sides can import)"
                    )
        hung = sorted(pending.values())
        if not errors and not hung:
            return [results[rank] for rank in range(self.world_size)]
        self.close()
        lines = []
        for rank in sorted(errors):
            lines.append(f"--- rank {rank} of {self.world_size} failed:")
            lines.append(errors[rank].rstrip())
        if errors:
            head = f"{what}: rank(s) {sorted(errors)} of {self.world_size} failed"
            if hung:
                head += f"; rank(s) {hung} were still running (waiting for the failed rank?)"
            raise LaunchError("\n".join([head + "; every worker was killed.", *lines]))
        raise LaunchTimeout(
            f"{what}: rank(s) {hung} of {self.world_size} did not return within {timeout:g} s "
            "(hung, e.g. in a collective another rank never entered); every worker was killed."
            + (f" Rank(s) {sorted(results)} returned." if results else ""),
            hung,
        )

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(b"")  # stop request; a busy worker gets killed below
        if self.server is not None and self.pids:
            with contextlib.suppress(forkserver.ServerError):  # else its ranks died with it
                self.server.stop(self.pids, grace=1.0)
        deadline = time.monotonic() + 1.0
        for process in self.spawned:
            try:
                process.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # not reaped, so its id is still its own group's: take its children too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5.0)
        for conn in self.conns:
            conn.close()
        if self.lifeline is not None:
            os.close(self.lifeline)
        self.pids, self.spawned, self.conns, self.lifeline = [], [], [], None


_WORKER_COMMAND = "from pytest_rollout_golden.parallel.launcher import _worker; _worker()"


def _worker() -> None:
    """Entry point of a worker process (arguments in ``sys.argv``, see ``_Pool._start``)."""
    read_fd, write_fd, lifeline, parent, rank, world_size, backend, port = sys.argv[1:9]
    forkserver.die_with_parent(int(parent), int(lifeline))
    conn = forkserver.Channel(int(write_fd), int(read_fd))
    forkserver.worker_main(conn, int(rank), int(world_size), backend, int(port))


# ---------------------------------------------------------------------- under torchrun


def _launch_torchrun(
    fn: Callable[..., Any], world_size: int, args: tuple[Any, ...], timeout: float
) -> list[Any]:
    import torch.distributed as dist

    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        import pytest

        pytest.skip(f"needs world size {world_size}; this torchrun job has {env_world} ranks")
    rank = int(os.environ["RANK"])
    if not dist.is_initialized():
        backend = _backend(world_size)
        if backend == "nccl":
            import torch

            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        forkserver.STATE["backend"] = backend
    key = (next(_TORCHRUN_LAUNCHES), _current_test(), callable_name(fn))
    interrupted: BaseException | None = None
    try:  # pickled here: a result all_gather_object cannot pickle would strand the others
        mine: tuple[Any, str, Any] = (key, "ok", pickle.dumps(fn(rank, *args)))
    except BaseException as exc:  # pytest.fail and Ctrl-C too: the others wait in the gather
        mine = (key, "error", traceback.format_exc())
        interrupted = exc if isinstance(exc, KeyboardInterrupt) else None
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    if interrupted is not None:
        raise interrupted
    return _torchrun_results(key, gathered)


def _torchrun_results(key: tuple[int, str, str], gathered: list[Any]) -> list[Any]:
    """Every rank's result of launch ``key``; LaunchError if a rank failed, answered another
    launch, or returned what this process cannot unpickle."""
    results: list[Any] = []
    errors: dict[int, str] = {}
    for r, (answered, status, payload) in enumerate(gathered):
        if answered != key:
            errors[r] = (
                f"it answered launch {_describe(answered)} while this rank ran launch "
                f"{_describe(key)}: the ranks are out of step (a rank failed, skipped or was "
                "deselected before a launch), so every later launch of this job fails too"
            )
        elif status != "ok":
            errors[r] = str(payload)
        else:
            try:
                results.append(pickle.loads(payload))
            except Exception as exc:
                errors[r] = f"its result could not be unpickled: {type(exc).__name__}: {exc}"
    if errors:
        world_size = len(gathered)
        lines = [f"{key[2]}: rank(s) {sorted(errors)} failed"]
        for r, text in sorted(errors.items()):
            lines += [f"--- rank {r} of {world_size} failed:", text.rstrip()]
        raise LaunchError("\n".join(lines))
    return results


_TORCHRUN_LAUNCHES = itertools.count(1)


def _current_test() -> str:
    """The node id of the test running in this process, or ''."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def _describe(key: tuple[int, str, str]) -> str:
    number, test, name = key
    return f"#{number} ({name} in {test or 'no test'})"


atexit.register(shutdown, server=True)

__all__ = ["LaunchError", "LaunchTimeout", "device", "launch", "shutdown", "under_torchrun"]
