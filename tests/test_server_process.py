"""`serve.process.reap_session`, what every server test's teardown relies on: once the server has
gone, whatever of its session outlives the grace (a Ray worker that ignores SIGTERM) is killed."""

import os
import signal
import subprocess
import sys
import time

from seqexport.serve.process import reap_session, session_pids

# a session leader that starts a child, both ignoring SIGTERM, and stays (as a raylet might)
STUBBORN = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
            "time.sleep(600)\n")


def test_a_session_process_that_outlives_the_grace_is_killed():
    leader = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(session_pids(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(session_pids(leader.pid)) == 2
        reap_session(leader.pid, grace=0.5)
        leader.wait(10)  # the leader is our child: reaped here, not left a zombie
        assert session_pids(leader.pid) == []
    finally:
        for pid in session_pids(leader.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if leader.poll() is None:
            leader.kill()
            leader.wait()
