"""A `seqexport serve` subprocess on 127.0.0.1, for tests and benchmarks: started in its own
session, ready once /health answers, stopped with SIGTERM and every process of its session
(Ray's raylet, GCS, workers) reaped, by pid, if any outlives it.

    with ServerProcess(folder, "--no-ray") as server:
        requests.get(server.url + "/health")
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, folder, *args: str, port: int | None = None, ready_timeout: float = 120.0,
                 log: str | Path | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [sys.executable, "-m", "seqexport.cli", "serve", str(folder), "--host", "127.0.0.1",
                     "--port", str(self.port), *args]
        self.ready_timeout = ready_timeout
        self.log_path = Path(log) if log else None
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT if self.log_path else out,
                                     start_new_session=True, env=env, preexec_fn=_end_with_parent)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`seqexport serve` exited with {self.proc.returncode} before it was ready"
                                   + (f"; see {self.log_path}" if self.log_path else ""))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"`seqexport serve` not ready after {self.ready_timeout:g} s")

    def session_pids(self) -> list[int]:
        """Live processes of the server's session (itself and whatever it started)."""
        return session_pids(self.proc.pid) if self.proc is not None else []

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        reap_session(self.proc.pid)


def session_pids(sid: int) -> list[int]:
    """Live processes of session `sid` (a process started with start_new_session and its own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid and _alive(int(entry.name)):
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


def reap_session(sid: int, grace: float = 10.0) -> None:
    """Wait up to `grace` s for session `sid`'s processes to end, then SIGKILL each, by pid."""
    deadline = time.monotonic() + grace
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.3)  # Ray's processes exit on their own once the driver has gone
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.1)  # a killed process lingers until the kernel has torn it down


def _end_with_parent() -> None:
    """In the child: SIGTERM when the process that started it dies (a test run killed before
    its teardown must not leave a server behind). Linux only; elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
