"""Utilities shared by the framework packages and the launcher. Build queries answer without
initialising Horovod."""

import contextlib
import functools
import importlib.util
import os

EXTENSIONS = ["tensorflow", "torch", "mxnet"]

# Framework package module and the framework module it needs, per extension name.
_FRAMEWORKS = {"tensorflow": ("horovod.tensorflow", "tensorflow"),
               "torch": ("horovod.torch", "torch"),
               "mxnet": ("horovod.mxnet", "mxnet")}


def _cache(f):
    """Memoises ``f`` on its positional and keyword arguments (which must be hashable)."""
    cache = {}

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        key = (args, frozenset(kwargs.items()))
        if key not in cache:
            cache[key] = f(*args, **kwargs)
        return cache[key]

    return wrapper


def _find(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@_cache
def extension_available(ext_base_name, verbose=False):
    """Whether the framework package for ``ext_base_name`` ('tensorflow', 'torch' or 'mxnet') and
    its framework are installed. Nothing is imported."""
    if ext_base_name not in _FRAMEWORKS:
        raise ValueError(f"unknown extension {ext_base_name!r}; expected one of {EXTENSIONS}")
    package, framework = _FRAMEWORKS[ext_base_name]
    return _find(package) and _find(framework)


def _built_backends():
    from horovod.common import _core
    return _core.built_backends()


@_cache
def gloo_built(verbose=False):
    """Whether the engine was built with the Gloo backend."""
    return "gloo" in _built_backends()


@_cache
def mpi_built(verbose=False):
    """Whether the engine was built with the MPI backend."""
    return "mpi" in _built_backends()


@_cache
def nccl_built(verbose=False):
    """NCCL's version code (e.g. 23203 for 2.32.3) when the engine was built with NCCL, else 0."""
    from horovod.common import _core
    return _core.nccl_built()


@_cache
def cuda_built(verbose=False):
    """Whether the engine was built with CUDA (its NCCL plugin)."""
    from horovod.common import _core
    return _core.cuda_built()


@_cache
def ddl_built(verbose=False):
    return False


@_cache
def ccl_built(verbose=False):
    return False


@_cache
def gpu_available(ext_base_name, verbose=False):
    """Whether GPU tensors of ``ext_base_name`` ('tensorflow', 'torch' or 'mxnet') can be used:
    the framework package is installed, Horovod was built with NCCL, and its NCCL plugin loads
    and sees a CUDA device. The plugin is tried in a child process (CUDA initialised in this
    process would not survive a later fork), so the first call takes about a second on a GPU
    build; a CPU-only build answers False at once."""
    if not extension_available(ext_base_name):
        return False
    if not cuda_built():
        return False
    import subprocess
    import sys
    probe = "from horovod.common import _core; print(_core.gpu_error())"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    available = done.returncode == 0 and done.stdout.strip() == ""
    if verbose and not available:
        print(f"Horovod cannot use GPU tensors: {done.stdout.strip() or done.stderr.strip()}")
    return available


@contextlib.contextmanager
def env(**kwargs):
    """Sets the given environment variables (None values are skipped) for the duration of the
    block, then restores or removes them."""
    saved = {k: os.environ.get(k) for k in kwargs}
    for k, v in kwargs.items():
        if v is not None:
            os.environ[k] = str(v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def split_list(items, n):
    """Splits ``items`` into ``n`` contiguous chunks whose lengths differ by at most one; the first
    ``len(items) % n`` chunks get the extra element."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def num_rank_is_power_2(num_rank):
    """Whether ``num_rank`` is a power of two (False for 0)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def is_iterable(x):
    try:
        iter(x)
    except TypeError:
        return False
    return True


def get_average_backwards_compatibility_fun(reduce_ops):
    """Returns ``handle_average_backwards_compatibility(op, average)`` for a framework's op
    constants (an object with ``Average`` and ``Sum``)."""
    import warnings

    def handle_average_backwards_compatibility(op, average):
        if op is not None:
            if average is not None:
                raise ValueError("The op parameter supersedes average. Please provide only one of them.")
            return op
        if average is not None:
            warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                          DeprecationWarning, stacklevel=3)
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average

    return handle_average_backwards_compatibility


# Framework packages (and the launcher) this core works with: distribution -> release series.
SUPPORTED_PACKAGES = {"horovod-torch": "0.28", "horovod-tf": "0.28", "horovod-keras": "0.28", "horovod-mxnet": "0.28",
                      "horovod-run": "0.28"}


def check_framework_package(distribution, version):
    """Called by a framework package at import: raises ImportError, with the command that fixes
    it, when this horovod-core does not support ``distribution`` at ``version``."""
    from horovod import __version__ as core_version
    series = SUPPORTED_PACKAGES.get(distribution)
    if series is None:
        raise ImportError(f"{distribution} is not a package this horovod-core {core_version} knows; "
                          f"supported: {', '.join(sorted(SUPPORTED_PACKAGES))}.")
    if version != series and not version.startswith(series + "."):
        raise ImportError(f"{distribution} {version} does not work with horovod-core {core_version}, which "
                          f"supports {distribution} {series}.x; install matching versions, e.g. "
                          f"pip install '{distribution}=={core_version}' 'horovod-core=={core_version}'.")
