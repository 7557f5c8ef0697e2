"""`python -m analysis.figure_worker PARENT_PID`: one worker of `analysis.common.figures.FigurePool`.

Its own module, so that it is tied to its parent before the seconds of importing matplotlib and
pandas: a parent killed meanwhile takes the worker with it.
"""

import ctypes
import os
import signal
import sys


def die_with(parent: int) -> None:
    """Asks Linux to kill this process when its parent dies, and exits now if it already has."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


if __name__ == "__main__":
    # Ctrl-C in a terminal reaches the whole process group: the caller decides, and ends this worker
    # (`FigurePool.close`) or takes it with it, without a traceback from each worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with(int(sys.argv[1]))
    from analysis.common.figures import serve

    serve()
