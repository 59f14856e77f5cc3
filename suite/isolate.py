"""Work in a child process that may die: the one process-isolation helper of the suite.

A kernel that segfaults or poisons its CUDA context takes its process with it; measured in a
child, it becomes a row that says ``crashed`` and the run goes on with a fresh child. The
kernel benchmark (``suite.runner``, ``--isolate``) and the training bench (``suite.train``) both
run their jobs through :class:`Worker`.

Protocol: the child (``serve``) reads one JSON job per stdin line and answers with one JSON line
tagged ``RESULT_TAG`` on stdout; its other output passes through to the parent's stdout,
indented. A result with ``"fatal": true`` (the CUDA context is unusable) ends the child after it
answered. The parent (:class:`Worker`) gets the result, or ``{"status": "crashed"}`` when the
child died during the job (with its ``returncode``: negative for a signal), or ``{"status":
"timeout"}`` when the job ran past its time limit (the child is killed); the next job then
starts a fresh child. :class:`InProcess` has the same interface without a child.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

RESULT_TAG = "@@RESULT "
ROOT = Path(__file__).resolve().parent.parent


def serve(handle: Callable[[dict], dict], stdin=None, stdout=None) -> None:
    """The child's loop: ``handle(job) -> result`` for each JSON line of ``stdin``; exit status 3
    after a fatal result, so that the parent starts a fresh process."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    for line in stdin:
        if not line.strip():
            continue
        result = handle(json.loads(line))
        stdout.write(RESULT_TAG + json.dumps(result) + "\n")
        stdout.flush()
        if result.get("fatal"):
            sys.exit(3)


def exit_text(returncode: int) -> str:
    """How a child ended, for a ``crashed`` row."""
    if returncode < 0:
        return f"child process killed by signal {-returncode}"
    return f"child process died (exit code {returncode})"


class InProcess:
    """:class:`Worker`'s interface, calling ``handle`` in this process (no isolation)."""

    def __init__(self, handle: Callable[[dict], dict]):
        self.handle = handle

    def run(self, job: dict, timeout_s: float | None = None) -> dict:
        return self.handle(job)

    def close(self) -> None:
        pass


class Worker:
    """Runs jobs one at a time in a child process ``cmd``; a fresh child after a crash, a
    timeout or :meth:`close`. The repository root is put on the child's PYTHONPATH."""

    def __init__(self, cmd: list[str], env: dict | None = None, echo_prefix: str = "  | "):
        self.cmd = list(cmd)
        self.env = dict(os.environ if env is None else env)
        self.env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), self.env.get("PYTHONPATH")]))
        self.echo_prefix = echo_prefix
        self.proc = None
        self.lines = None

    def _start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1, env=self.env)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self.lines), daemon=True).start()

    @staticmethod
    def _pump(proc, lines) -> None:
        with proc.stdout:  # closed at EOF, not left to the garbage collector (ResourceWarning)
            for line in proc.stdout:
                lines.put(line)
        lines.put(None)  # EOF: the child exited

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass  # a line the dead child never read
        self.proc = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def run(self, job: dict, timeout_s: float | None = None) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # died at start-up: reported below as crashed
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                self._kill()
                return {"status": "timeout",
                        "error": f"no result within {timeout_s:.0f} s; child process killed"}
            if line is None:
                code = self.proc.wait()
                self._kill()  # closes its stdin
                return {"status": "crashed", "returncode": code,
                        "error": f"{exit_text(code)} during the job"}
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG):])
                if result.get("fatal"):
                    self._kill()
                return result
            sys.stdout.write(self.echo_prefix + line)

    def close(self) -> None:
        """End the child (EOF on its stdin; killed if it does not exit within 30 s)."""
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a child that will not exit is killed
                self._kill()
            self.proc = None
