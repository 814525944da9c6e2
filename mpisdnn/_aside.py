"""One function run in a helper process beside this one: kernels compiled on another core.

numba compiles one kernel at a time in a process (its compiler lock), so a run of one rank
compiles its kernel families one after the other even where a second core is idle. A command
that knows which kernels it will need later starts a helper (:func:`start`) that calls a
function compiling them, while the process itself compiles (and runs) what it needs first.
Both save into the same numba cache under the per-kernel locks of
:func:`mpisdnn.kernel_cache.install`: a kernel the helper is compiling when the process
reaches it is waited for and loaded, never compiled twice.

The helper is a fresh interpreter (``python -m mpisdnn._aside``), not a fork: a fork of a
process that has started threads (numba's, MPI's) can deadlock. It imports the same
``mpisdnn`` package (its parent directory first on ``PYTHONPATH``), so its kernels are keyed to
the same source files, and sees the environment less the MPI launcher's variables, so nothing
in it takes itself for a rank. It reads the function's arguments as one pickle on standard
input and then watches that pipe: when the process closes it (:meth:`Aside.close`) or dies,
the helper ends at once, whatever it was compiling (numba saves each kernel by renaming a
finished file, so a helper ended mid-compile leaves no broken cache entry). Its output is
discarded; its exit status only tells whether it finished.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading

__all__ = ["Aside", "start", "helper_environ", "spare_cpus"]

#: Prefixes of the variables an MPI launcher (MPICH's hydra, Open MPI, PMIx, Intel MPI) sets
#: for its ranks: a helper that saw them could take itself for a rank if it loaded MPI.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPICH_", "I_MPI_", "MPI_LOCAL")


def spare_cpus() -> int:
    """CPUs this process may run on beyond the one it uses (0 where it has only one)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(0, n - 1)


def helper_environ(environ=None) -> dict:
    """The helper's environment: ``environ`` (default ``os.environ``) without the MPI
    launcher's variables, with this package's parent directory first on ``PYTHONPATH``."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = root if not rest else os.pathsep.join([root, rest])
    return env


class Aside:
    """A helper process running one function (see :func:`start`)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the helper to finish; its exit status (0: the function returned)."""
        return self.proc.wait(timeout)

    def close(self) -> None:
        """End the helper now if it is still running (idempotent)."""
        try:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()  # the helper's watcher ends it
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(target: str, *args) -> Aside | None:
    """Run ``target(*args)`` in a helper process, beside this one.

    Parameters
    ----------
    target : str
        ``"package.module:function"``, imported by the helper.
    *args
        The function's arguments (pickled).

    Returns
    -------
    Aside or None
        The helper, to :meth:`~Aside.close` once its work is no longer wanted; ``None`` where
        no helper could be started (the caller then does the work itself when it gets there).
    """
    try:
        payload = pickle.dumps((target, args))
        proc = subprocess.Popen(  # noqa: S603 - this interpreter, this package's module
            [sys.executable, "-m", "mpisdnn._aside"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=helper_environ(),
            close_fds=True,
        )
    except (OSError, ValueError, pickle.PicklingError):
        return None
    try:
        proc.stdin.write(payload)
        proc.stdin.flush()
    except OSError:  # it died at once: nothing to wait for
        proc.kill()
        proc.wait()
        return None
    return Aside(proc)


def _watch(stream) -> None:
    """End this helper when its parent closes the pipe or dies (the read returns)."""
    try:
        stream.read()
    finally:
        os._exit(3)


def _main() -> int:
    import importlib

    from .kernel_cache import configure_cache_dir, install

    stdin = sys.stdin.buffer
    target, args = pickle.load(stdin)
    threading.Thread(target=_watch, args=(stdin,), daemon=True).start()
    configure_cache_dir()
    install()  # the per-kernel locks: the parent waits for what this compiles
    module, _, name = target.partition(":")
    getattr(importlib.import_module(module), name)(*args)
    return 0


if __name__ == "__main__":
    os._exit(_main())  # at once: the watcher thread may still be reading the pipe
