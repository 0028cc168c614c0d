"""Run a Python command line as a process forked from a warm interpreter.

A documented command is mostly its imports (torch and transformers: about 2.6 CPU-s of a 3-5 s
run on this machine), and the suite runs some thirty of them. ``run_warm`` runs each as its own
process, with its own argv, environment, working directory, stdin, stdout, stderr, process
group and exit status, like ``subprocess.run([sys.executable, ...])``, but forked from a
forkserver that imported the third-party libraries once (multiprocessing's ``forkserver``
context with a preload list). The rules that keep it the command as typed:

- only third-party libraries are preloaded, none of this project's modules: the command imports
  the project itself, as a fresh interpreter would, so an import-time error still fails it;
- the forkserver starts with this process's environment, which sets what the preloaded libraries
  read at import (OMP_NUM_THREADS, the hub's offline switches) to what the commands set;
- the script runs as ``__main__`` with its folder first on ``sys.path`` (``-m`` modules with the
  working directory first), and ``atexit`` handlers run before the process exits;
- a command past its timeout is killed with its whole process group (children included);
- only single-threaded commands fork warm (``OMP_NUM_THREADS=1`` in the command's environment and in
  this process's, which the forkserver started with): a process forked from an interpreter that
  has imported torch runs a multi-threaded OpenMP pool pathologically (a 2-thread matmul loop took
  16-31 s in the fork, 0.3 s single-threaded), so any other command runs as a fresh interpreter.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

# what the recipes import besides the project (deepspeed through accelerate's unwrap_model, pyplot
# for the curves, datasets and trl through the engines): about 1 CPU-s of each recipe command
PRELOAD = ["numpy", "torch", "transformers", "transformers.models.llama.modeling_llama", "accelerate",
           "safetensors.torch", "tqdm", "matplotlib.pyplot", "deepspeed", "datasets", "trl"]
_context = None


def _forkserver():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """The forked process: become the command, run it, exit with its status."""
    os.setsid()  # its own process group, so a timeout can kill the command's children too
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY), (2, err, os.O_WRONLY)):
        os.dup2(os.open(path, flags), fd)
    code: object = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, cwd)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code
    except BaseException:  # what an uncaught exception does: the traceback on stderr, status 1
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


def run_warm(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], env=env, cwd=cwd, stdin=DEVNULL,
    capture_output=True, text=True, timeout=timeout)``, forked warm; ``argv`` is a script and its
    arguments, or ``-m module ...``. Raises ``subprocess.TimeoutExpired`` like ``subprocess.run``.
    A command that is not single-threaded runs as a fresh interpreter (the module's rules)."""
    if not (env.get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS") == "1"):
        return _run_cold(argv, env, cwd, timeout)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        out.touch()
        err.touch()
        proc = _forkserver().Process(target=_child, args=(list(argv), dict(env), str(cwd), str(out), str(err)))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.join()
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
        return subprocess.CompletedProcess([sys.executable, *argv], proc.exitcode,
                                           out.read_text(errors="replace"), err.read_text(errors="replace"))


def _run_cold(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``argv`` in a fresh interpreter, in its own session so a timeout kills its children too."""
    with subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended between the timeout and the kill
                pass
            proc.communicate()
            raise
    return subprocess.CompletedProcess([sys.executable, *argv], proc.returncode, out, err)
