"""Runs one run of a sweep so that it never outlives the sweep:

    python sweeps/child_guard.py SWEEP_PID python train.py ARGS...

(sweeps.runner starts it as a script, importing nothing of the repository.) It starts the
command and waits for it, exiting with its status. On Linux the kernel tells it when the
sweep dies, whatever killed the sweep (PR_SET_PDEATHSIG), and it sends the run one
SIGTERM: train.py saves a checkpoint and exits, and the next sweep resumes it. Why not
set the signal on train.py itself: the kernel sends it again each time a thread of the
(multithreaded) sweep exits, and a second signal makes train.py stop without saving.
The sweep's own SIGINT/SIGTERM reach the run through their process group; the guard
takes no action on them.
"""
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def main() -> int:
    sweep_pid, cmd = int(sys.argv[1]), sys.argv[2:]
    state = {"child": None, "orphaned": False}

    def sweep_died(signum, frame):
        if state["orphaned"]:
            return  # the same news again, from another of the sweep's threads
        state["orphaned"] = True
        if state["child"] is not None and state["child"].poll() is None:
            state["child"].send_signal(signal.SIGTERM)

    signal.signal(signal.SIGUSR1, sweep_died)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the run gets them too: it decides
        signal.signal(sig, lambda signum, frame: None)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
    except (OSError, AttributeError):  # not Linux: only the sweep's handler stops runs
        pass
    if os.getppid() != sweep_pid:
        return "sweep: the sweep that started this run is gone; nothing run"
    state["child"] = subprocess.Popen(cmd)
    if state["orphaned"]:
        state["child"].send_signal(signal.SIGTERM)
    while True:
        try:
            code = state["child"].wait()
            break
        except InterruptedError:
            continue
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
