"""Progress bars: tqdm's text bar on a terminal, none inside a Jupyter kernel.

In a notebook every redraw of a text bar is another stderr fragment in the cell's output, and
`tqdm.auto`'s widget needs ipywidgets, which the runtime does not install (its absence is the
`TqdmWarning: IProgress not found` that transformers' import of `tqdm.auto` prints in a kernel).
A notebook's cells show their results instead; the CLIs keep their bars.
"""

from __future__ import annotations

import sys
import warnings

from tqdm import TqdmWarning
from tqdm import tqdm as _tqdm

# Only that one warning, and only where it is raised: transformers' and huggingface_hub's bars are
# theirs to draw; this is no fault of the user's setup.
warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel's: ipykernel imported is not enough (a test
    session that drives a notebook imports it too, and its own bars must stay)."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def tqdm(*args, **kwargs) -> _tqdm:
    """`tqdm.tqdm`, disabled inside a Jupyter kernel."""
    if in_kernel():
        kwargs["disable"] = True
    return _tqdm(*args, **kwargs)
