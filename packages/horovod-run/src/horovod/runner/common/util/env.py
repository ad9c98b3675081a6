"""Environment helpers: which driver variables reach workers, and a worker's rank and size."""

import os
import re
from horovod.runner.common.util import env_names

# Driver variables never forwarded on a worker command line: shell functions, the previous
# directory, GPU pinning (each host decides its own), and the job secret, which travels only
# through the child's environment.
IGNORE_REGEXES = {"BASH_FUNC_.*", "OLDPWD", ".*CUDA_VISIBLE_DEVICES", "_HOROVOD_SECRET_KEY"}

_RANK_SIZE_VARS = [
    (env_names.RANK, env_names.SIZE),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
]


def is_exportable(name: str) -> bool:
    """True if the driver variable ``name`` may be forwarded to workers by name."""
    return not any(re.match(pattern, name) for pattern in IGNORE_REGEXES)


def get_env_rank_and_size():
    """Return ``(rank, size)`` of this worker from the launcher's environment.

    Looks at (HOROVOD_RANK, HOROVOD_SIZE), then Open MPI's, then PMI's variables, and returns
    the first pair found as ints, or ``(0, 1)`` when none is set. Raises ``RuntimeError`` when
    only one variable of a pair is set.
    """
    for rank_var, size_var in _RANK_SIZE_VARS:
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is None and size is None:
            continue
        if rank is None or size is None:
            raise RuntimeError("%s and %s must be set together, found only %s"
                               % (rank_var, size_var, size_var if rank is None else rank_var))
        return int(rank), int(size)
    return 0, 1
