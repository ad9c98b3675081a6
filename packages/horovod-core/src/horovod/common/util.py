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
        """The reduce op that a collective's ``op`` and deprecated ``average`` arguments ask for.

        Args:
            op: a reduce op (``Average``, ``Sum``, ...) or None.
            average (bool or None): the deprecated spelling: True for ``Average``, False for
                ``Sum`` (with a ``DeprecationWarning``).

        Returns:
            ``op`` when given, else what ``average`` asks for, else ``Average``.

        Raises:
            ValueError: both ``op`` and ``average`` are given.
        """
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


def _ordering_key(version):
    """A sort key for a PEP 440 version string: its release numbers, then pre-releases and
    development releases before the final release, post-releases after it."""
    import re
    release = _release(version)
    if release is None:
        raise ValueError(f"{version!r} is not a version (expected numbers separated by dots, like '2.5.0')")
    rest = version.strip().lstrip("v")[len(".".join(map(str, release))):].lower()
    if re.match(r"[._-]?(a|b|c|rc|alpha|beta|pre|preview|dev)(\d|[._-]|$)", rest):
        stage = 0
    elif re.match(r"[._-]?(post|rev|r)(\d|[._-]|$)", rest):
        stage = 2
    else:
        stage = 1
    return release, stage


@_cache
def is_version_greater_equal_than(ver, target):
    """Whether version ``ver`` is at least ``target``.

    Args:
        ver (str): a version, e.g. ``tf.__version__`` (``'2.15.0'``, ``'2.16.0rc1'``).
        target (str): ``'major.minor.patch'``, three integers.

    Returns:
        bool. Pre-releases come before their release (``'2.16.0rc1'`` is not >= ``'2.16.0'``);
        missing parts count as 0. Answers are memoised.

    Raises:
        ValueError: an argument is not a str, ``target`` is not three dot-separated integers, or
            ``ver`` starts with no version number.
    """
    import re
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"versions must be given as str, got {type(ver).__name__} and {type(target).__name__}")
    if not re.fullmatch(r"\d+\.\d+\.\d+", target.strip()):
        raise ValueError(f"target version {target!r} must be 'major.minor.patch' (three integers separated by dots)")
    (have, have_stage), (want, want_stage) = _ordering_key(ver), _ordering_key(target)
    have, want = _padded(have, want)
    return (have, have_stage) >= (want, want_stage)


def check_installed_version(name, version, exception=None):
    """Checks that framework ``name`` is installed at ``version``.

    Args:
        name (str): the framework's distribution name (``'torch'``, ``'tensorflow'``, ``'mxnet'``).
        version (str): the version the caller was made for.
        exception (BaseException or None): an error met while loading the caller's extension; it
            is raised again when the versions agree (the mismatch was not its cause).

    Raises:
        HorovodVersionMismatchError: the installed version differs from ``version`` (chained to
            ``exception`` when given).
        the given ``exception``: when the versions agree or ``name`` is not installed.
    """
    from importlib import metadata

    from horovod.common.exceptions import HorovodVersionMismatchError
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        installed = None
    if installed is not None and installed != version:
        raise HorovodVersionMismatchError(name, version, installed) from exception
    if exception is not None:
        raise exception


def get_ext_suffix():
    """The file name ending of this interpreter's compiled extension modules
    (``'.cpython-311-x86_64-linux-gnu.so'``)."""
    import sysconfig
    return sysconfig.get_config_var("EXT_SUFFIX") or sysconfig.get_config_var("SO")


def get_extension_full_path(pkg_path, *args):
    """The path of a compiled extension module: ``args`` are its folders below the folder of
    ``pkg_path`` (a module's ``__file__``), then its base name, to which the extension suffix is
    added. ``get_extension_full_path(horovod.common.__file__, '_core')`` is the core's library."""
    if not args:
        raise ValueError("expected at least the extension's base name after pkg_path")
    folder = os.path.dirname(os.path.realpath(pkg_path))
    return os.path.join(folder, *args[:-1], args[-1] + get_ext_suffix())


def check_extension(ext_name, ext_env_var, pkg_path, *args):
    """Raises ImportError naming ``ext_name`` and the build variable ``ext_env_var`` (e.g.
    ``HOROVOD_WITH_PYTORCH``) when the extension ``get_extension_full_path(pkg_path, *args)``
    does not exist; returns None when it does."""
    full_path = get_extension_full_path(pkg_path, *args)
    if not os.path.exists(full_path):
        raise ImportError(f"Extension {ext_name} has not been built ({full_path} does not exist). "
                          f"If this is not expected, reinstall Horovod with {ext_env_var}=1 to debug the build error.")


# The framework packages and the launcher each declare (Requires-Dist) the range of horovod-core
# versions they work with. pip keeps them compatible when it installs them together; the framework
# packages also check at import, with check_framework_package, what pip does not catch (a later
# `pip install horovod-core==...`, `--no-deps`). horovod-run's range is for pip alone: the launcher
# runs commands without importing the core.
SUPPORTED_PACKAGES = ("horovod-torch", "horovod-tf", "horovod-keras", "horovod-mxnet", "horovod-run")


def _release(version):
    """The release numbers of a version string: '0.29.0rc1' -> (0, 29, 0); None if there are none."""
    import re
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def _padded(a, b):
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def version_satisfies(version, specifier):
    """Whether ``version`` is in ``specifier`` (PEP 440 clauses joined by commas: ``>=0.29,<0.30``,
    ``==0.29.*``, ``~=0.29.0``, ...), judged on release numbers (pre-release and local parts are
    ignored). A clause this cannot judge counts as satisfied: the check never blocks on a doubt."""
    import re
    have = _release(version)
    if have is None:
        return True
    for clause in specifier.split(","):
        match = re.fullmatch(r"\s*(===|==|!=|~=|<=|>=|<|>)\s*([^\s]+)\s*", clause)
        if not match:
            continue
        op, wanted = match.groups()
        if op in ("==", "!=") and wanted.endswith(".*"):
            prefix = _release(wanted[:-2])
            if prefix is None:
                continue
            equal = _padded(have, prefix)[0][:len(prefix)] == prefix
            if equal != (op == "=="):
                return False
            continue
        want = _release(wanted)
        if want is None or op == "===":
            continue
        a, b = _padded(have, want)
        if op == "~=":
            if len(want) < 2 or a < b or a[:len(want) - 1] != want[:-1]:
                return False
            continue
        ok = {"==": a == b, "!=": a != b, "<=": a <= b, ">=": a >= b, "<": a < b, ">": a > b}[op]
        if not ok:
            return False
    return True


def core_requirement(distribution):
    """The horovod-core version range ``distribution`` declares (``'>=0.29,<0.30'``), '' when it
    declares none; None when ``distribution`` is not installed."""
    import re
    from importlib import metadata
    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return None
    for requirement in requires:
        match = re.fullmatch(r"\s*horovod[-_.]core\s*(?:\[[^\]]*\])?\s*\(?([^;)]*)\)?\s*(?:;(.*))?",
                             requirement, re.IGNORECASE)
        if match and "extra" not in (match.group(2) or ""):
            return match.group(1).strip()
    return ""


def check_framework_package(distribution, version=None):
    """Called by a framework package at import: raises ImportError when the
    installed horovod-core is not in the range ``distribution`` declares, naming both and giving
    the pip command that fixes it. ``version``: the distribution's (read from its metadata when
    None). Does nothing for a package run from a source tree (not installed)."""
    from importlib import metadata
    if distribution not in SUPPORTED_PACKAGES:
        raise ImportError(f"{distribution} is not a package this horovod-core knows; "
                          f"supported: {', '.join(SUPPORTED_PACKAGES)}.")
    needed = core_requirement(distribution)
    try:
        core = metadata.version("horovod-core")
    except metadata.PackageNotFoundError:
        return
    if not needed or version_satisfies(core, needed):
        return
    if version is None:
        version = metadata.version(distribution)
    raise ImportError(f"{distribution} {version} needs horovod-core{needed}, but horovod-core {core} is "
                      f"installed. Fix: pip install 'horovod-core{needed}'")
