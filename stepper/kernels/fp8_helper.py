"""An FP8 helper process: `python -m stepper.kernels.fp8_helper FD` serves the pipe FD (see fp8_workers),
whole experts too (kernels.experts).

A module of its own, so that the helper's code runs as `stepper.kernels.fp8_workers`, the module every
other module imports, and not as a second copy named __main__ with globals of its own.
"""

import sys
from multiprocessing.connection import Connection

from stepper.kernels.experts import WORK
from stepper.kernels.fp8_workers import serve

if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])), WORK)
