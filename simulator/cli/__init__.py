"""The `simulate` command line: `main` holds the lazily loaded group, one module per verb. The top
layer: it may import anything; nothing imports it but `calibration`'s verbs (their shared options).

Importing it keeps numpy's BLAS on one thread (`OPENBLAS_NUM_THREADS`, unless the user set it): by
default OpenBLAS starts a thread per core at import, which busy-waits after start-up and after every
BLAS call. A command's BLAS work is a few dot products over one run's columns, so the other threads
only burn a core that a sweep's other workers (or anything else) could use.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
