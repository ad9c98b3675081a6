"""The bare-install test: the wheels in dist/ on a Debian 12 that has nothing but Python.

    python ci/bare_install.py [--dist DIST] [--cache CACHE]

Run as root (nox -s bare-install does it). Steps:

1. A minimal Debian 12 root in CACHE/root: `debootstrap --variant=minbase` with only python3 and
   python3-venv (ROOT_PACKAGES). Built once; rebuilt when it is missing or when its recipe
   (suite, mirror, packages, the files written into it) changes, which CACHE/root.recipe records.
2. A wheelhouse, CACHE/wheelhouse: the third-party wheels the job needs (PyTorch 2.13.0's CPU
   build, scikit-learn for the example's data set, and what the project's wheels require),
   fetched on this host with `pip download --only-binary :all:`; fetched again only when that list
   of requirements changes.
3. The job, in a throw-away view of the root: an overlay whose lower layer is the cached root and
   whose upper layer is CACHE/run-<pid>, entered with `chroot` inside new mount and PID namespaces
   (`unshare`). Nothing the job writes (the virtualenv, Python's bytecode caches, the checkpoint)
   reaches the cached root; the mounts (/proc, /dev, /dev/shm, the overlay, the wheelhouse) live
   only in that mount namespace and are unmounted before it ends, and any process left over dies
   with the PID namespace. CACHE/run-<pid> is deleted afterwards.

   Inside: a virtualenv, `pip install --no-index` of horovod-core, horovod-torch and horovod-run
   from a copy of dist/ plus torch and scikit-learn from the wheelhouse, then
   `horovodrun --check-build` and `horovodrun -np 2 -H localhost:2 python pytorch_digits.py`.

Checked besides the job succeeding: the root has no libgloo, no C/C++ compiler and no CMake; the
core loads the Gloo the wheel carries; the core imports without MPI and says why MPI is unavailable.
Exit status 0 when everything passed, 1 with the reason otherwise.
"""

import argparse
import email.parser
import hashlib
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "pytorch" / "pytorch_digits.py"

SUITE = "bookworm"  # Debian 12, whose python3 is 3.11: the cp311 wheels' interpreter
CACHE = pathlib.Path("/var/cache/horovod-bare-install")  # the root and the wheelhouse, kept between runs
MIRROR = os.environ.get("HOROVOD_BARE_ROOT_MIRROR", "http://deb.debian.org/debian")
ROOT_PACKAGES = ["python3", "python3-venv"]
# Written into the root after debootstrap: minbase has no /etc/hosts, and horovodrun's
# `-H localhost:2` needs localhost to resolve without DNS.
ROOT_FILES = {"etc/hosts": "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"}

# What the job installs besides the project's wheels.
FRAMEWORK = ["torch==2.13.0", "scikit-learn"]
PROJECT = ["horovod-core", "horovod-torch", "horovod-run"]
NP = 2

# Present in the root means the test proves nothing: a compiler, CMake, or a Gloo of the system.
FORBIDDEN_PROGRAMS = ["cc", "c++", "gcc", "g++", "clang", "clang++", "cmake"]


def log(message: str) -> None:
    print(f"bare-install: {message}", flush=True)


class Failure(Exception):
    pass


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    log("$ " + shlex.join(cmd))
    proc = subprocess.run(cmd, **kwargs)
    if proc.returncode != 0:
        raise Failure(f"{shlex.join(cmd[:3])}... exited with status {proc.returncode}")
    return proc


def recipe() -> str:
    lines = [f"suite {SUITE}", f"mirror {MIRROR}", "variant minbase", f"include {','.join(ROOT_PACKAGES)}"]
    lines += [f"file {path} {hashlib.sha256(text.encode()).hexdigest()}" for path, text in sorted(ROOT_FILES.items())]
    return "\n".join(lines) + "\n"


def ensure_root(cache: pathlib.Path) -> pathlib.Path:
    """The cached Debian root, built with debootstrap when missing or when its recipe changed."""
    root, stamp = cache / "root", cache / "root.recipe"
    wanted = recipe()
    if root.is_dir() and stamp.is_file() and stamp.read_text() == wanted:
        log(f"Debian {SUITE} root {root} is up to date with its recipe")
        return root
    if shutil.which("debootstrap") is None:
        raise Failure("debootstrap is not installed (Debian: apt-get install debootstrap; "
                      "ci/install-system-deps.sh does it)")
    started = time.monotonic()
    stamp.unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    building = cache / "root.new"
    shutil.rmtree(building, ignore_errors=True)
    # In a mount namespace of its own: debootstrap mounts /proc and /sys in the new root, and an
    # interrupted run would otherwise leave them mounted.
    run(["unshare", "--mount", "--propagation", "private", "--",
         "debootstrap", "--variant=minbase", f"--include={','.join(ROOT_PACKAGES)}", SUITE, str(building), MIRROR])
    for path, text in ROOT_FILES.items():
        (building / path).write_text(text)
    # apt's downloaded packages are not part of the root a user would have.
    for deb in (building / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        deb.unlink()
    building.rename(root)
    stamp.write_text(wanted)
    log(f"built the Debian {SUITE} root {root} in {time.monotonic() - started:.0f} s")
    return root


def check_root_is_bare(root: pathlib.Path) -> None:
    """No compiler, no CMake, no libgloo anywhere in the root."""
    found = []
    for folder in ["usr/bin", "usr/local/bin", "bin", "usr/sbin", "sbin"]:
        for program in FORBIDDEN_PROGRAMS:
            path = root / folder / program
            if path.exists() or path.is_symlink():
                found.append(f"/{folder}/{program}")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (dirpath == str(root) and d in ("proc", "sys", "dev"))]
        found += [os.path.join(dirpath, f)[len(str(root)):] for f in filenames if f.startswith("libgloo")]
    if found:
        raise Failure(f"the root {root} is not bare: it has {', '.join(sorted(found))}")
    log(f"the root has no compiler ({', '.join(FORBIDDEN_PROGRAMS)} absent) and no libgloo")


def wheel_requirements(wheel: pathlib.Path) -> list[str]:
    """Requires-Dist of `wheel`, without extras' requirements."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    return [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]


def project_wheels(dist: pathlib.Path) -> list[pathlib.Path]:
    wheels = []
    for package in PROJECT:
        found = sorted(dist.glob(package.replace("-", "_") + "-*.whl"))
        if len(found) != 1:
            raise Failure(f"expected one {package} wheel in {dist}, found {len(found)} (run nox -s build)")
        wheels.append(found[0])
    return wheels


def ensure_wheelhouse(cache: pathlib.Path, wheels: list[pathlib.Path]) -> pathlib.Path:
    """The third-party wheels of the job, downloaded on this host (same Python 3.11, same glibc)."""
    requirements = list(FRAMEWORK)
    for wheel in wheels:
        requirements += [r for r in wheel_requirements(wheel) if not r.startswith("horovod-")]
    requirements = sorted(set(requirements))
    house, stamp = cache / "wheelhouse", cache / "wheelhouse.requirements"
    listed = "\n".join(requirements) + "\n"
    if house.is_dir() and stamp.is_file() and stamp.read_text() == listed:
        log(f"wheelhouse {house} is up to date ({len(list(house.glob('*.whl')))} wheels)")
        return house
    stamp.unlink(missing_ok=True)
    house.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    run([sys.executable, "-m", "pip", "download", "--only-binary", ":all:", "--dest", str(house), *requirements])
    stamp.write_text(listed)
    log(f"wheelhouse {house} filled in {time.monotonic() - started:.0f} s")
    return house


# Runs inside the chroot (sh), from the scratch folder /bare-install: install, then the checks.
INNER = r"""
set -eu
cd /bare-install
step() {{ echo "bare-install (in the root): $*"; }}
for program in {forbidden}; do
  if command -v "$program" >/dev/null 2>&1; then echo "bare-install: $program is in the root" >&2; exit 1; fi
done
step "python3 is $(python3 --version), no compiler, no CMake"
python3 -m venv venv
. venv/bin/activate
step "pip install --no-index {project} {framework}"
python -m pip install --quiet --no-index --no-cache-dir --disable-pip-version-check \
  --find-links dist --find-links wheelhouse {project} {framework}
python -m pip list --disable-pip-version-check --format=freeze | grep -i -e '^horovod' -e '^torch=' -e '^scikit-learn='
python - <<'EOF'
from horovod.common import _core
from horovod.common.basics import HorovodBasics
gloo = sorted({{line.split()[-1] for line in open("/proc/self/maps") if "libgloo" in line}})
assert len(gloo) == 1 and "/horovod_core.libs/" in gloo[0], gloo
hvd = HorovodBasics()
assert hvd.gloo_built() and not hvd.mpi_built(), (hvd.gloo_built(), hvd.mpi_built())
why = _core.plugin_error("mpi")
assert "libmpi" in why, why
print("bare-install (in the root): the core loads", gloo[0])
print("bare-install (in the root): MPI is unavailable, and the core says why:", why)
EOF
step "horovodrun --check-build"
horovodrun --check-build
step "horovodrun -np {np} -H localhost:{np} python pytorch_digits.py"
horovodrun -np {np} -H localhost:{np} python pytorch_digits.py --checkpoint /bare-install/checkpoint.pt
"""

# Runs on the host in new mount and PID namespaces: mount the view, chroot into it, unmount.
OUTER = r"""
set -eu
view={view}
mount -t overlay overlay -o lowerdir={root},upperdir={upper},workdir={work} "$view"
mount -t proc proc "$view/proc"
mount --bind /dev "$view/dev"
mount -t tmpfs -o size=2g,mode=1777 tmpfs "$view/dev/shm"
mkdir -p "$view/bare-install/wheelhouse"
mount --bind -o ro {wheelhouse} "$view/bare-install/wheelhouse"
status=0
chroot "$view" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/bare-install/home \
  TMPDIR=/bare-install/tmp LANG=C.UTF-8 PYTHONUNBUFFERED=1 /bin/sh /bare-install/inner.sh || status=$?
set +e
# Every other process of this PID namespace (this shell is its PID 1) must end with the job: wait up
# to 30 s for the last ones to exit, then name any that did not (they die with the namespace).
# Builtins only, so that the scan does not see itself.
tries=60
while :; do
  left=""
  for p in "$view"/proc/[0-9]*; do
    [ "${{p##*/}}" = 1 ] && continue
    read -r stat 2>/dev/null < "$p/stat" || continue
    state=${{stat##*) }}
    [ "${{state%% *}}" = Z ] && continue
    name=${{stat%%) *}}
    left="$left ${{p##*/}}(${{name#*(}})"
  done
  [ -z "$left" ] && break
  tries=$((tries - 1))
  if [ $tries -le 0 ]; then
    echo "bare-install: the job left processes behind:$left" >&2
    status=1
    break
  fi
  sleep 0.5
done
for target in "$view/bare-install/wheelhouse" "$view/dev/shm" "$view/dev" "$view/proc" "$view"; do
  umount "$target" || status=1
done
exit $status
"""


def run_job(cache: pathlib.Path, root: pathlib.Path, house: pathlib.Path, dist: pathlib.Path) -> None:
    scratch = cache / f"run-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    upper, work, view = scratch / "upper", scratch / "work", scratch / "view"
    try:
        for folder in (work, view):
            folder.mkdir(parents=True)
        # What the job starts with, put in the overlay's upper layer: /bare-install in the view.
        job = upper / "bare-install"
        for folder in (job / "dist", job / "home", job / "tmp"):
            folder.mkdir(parents=True)
        for wheel in dist.glob("*.whl"):
            shutil.copy2(wheel, job / "dist")
        shutil.copy2(EXAMPLE, job)
        (job / "inner.sh").write_text(INNER.format(
            forbidden=" ".join(FORBIDDEN_PROGRAMS), project=" ".join(PROJECT),
            framework=" ".join(shlex.quote(r) for r in FRAMEWORK), np=NP))
        outer = OUTER.format(view=shlex.quote(str(view)), root=shlex.quote(str(root)),
                             upper=shlex.quote(str(upper)), work=shlex.quote(str(work)),
                             wheelhouse=shlex.quote(str(house)))
        started = time.monotonic()
        run(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--", "sh", "-c", outer])
        log(f"the job in the bare root passed in {time.monotonic() - started:.0f} s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if scratch.exists():
            raise Failure(f"could not delete {scratch}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=pathlib.Path, default=REPO / "dist", help="the project's wheels")
    parser.add_argument("--cache", type=pathlib.Path, default=CACHE,
                        help="where the Debian root and the wheelhouse are kept between runs")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bare-install: needs root (debootstrap, chroot and mounts)", file=sys.stderr)
        return 1
    try:
        args.cache.mkdir(parents=True, exist_ok=True)
        wheels = project_wheels(args.dist.resolve())
        root = ensure_root(args.cache)
        check_root_is_bare(root)
        house = ensure_wheelhouse(args.cache, wheels)
        run_job(args.cache, root, house, args.dist.resolve())
    except Failure as e:
        print(f"bare-install: FAILED: {e}", file=sys.stderr)
        return 1
    log("passed: the wheels install and train on a Debian 12 root with nothing but Python")
    return 0


if __name__ == "__main__":
    sys.exit(main())
