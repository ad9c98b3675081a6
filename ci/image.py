"""Horovod's container image (docker/Dockerfile), built here with buildah: what `nox -s image` runs.

    python ci/image.py build [--dist DIST] [--gpu-dist GPU_DIST]
    python ci/image.py clean

Run as root. `build`:

1. The base, localhost/horovod-base:bookworm: the Debian 12 root that ci/bare_install.py makes with
   debootstrap (cached in /var/cache/horovod-bare-install), imported into buildah's storage once
   and again only when that root's recipe changes (CACHE/base.recipe records it).
2. The CPU image, localhost/horovod:cpu, from docker/Dockerfile on that base, with
   `buildah bud --isolation chroot --layers` (the OCI runtimes do not run on every machine, e.g.
   one whose cgroups are in hybrid mode; chroot isolation needs none). pip takes its third-party
   wheels from bare-install's wheelhouse (PyTorch's CPU build, scikit-learn and the project's
   requirements), mounted read-only at /wheelhouse, so the build reads nothing from PyPI; Debian's
   packages come from the mirror. Every layer is kept in CACHE/storage: a second build with the
   same inputs takes seconds.
3. The GPU variant, as far as it can be built without its CUDA base: the same Dockerfile with the
   CPU base standing in for the CUDA one, the core wheel from GPU_DIST (built with
   HOROVOD_GPU_OPERATIONS=NCCL by nox -s build-gpu) and NCCL from the nvidia-nccl-cu13 wheel
   (downloaded once into CACHE/wheelhouse-gpu); in a container of it, the core must say it was
   built with NCCL and CUDA and find the wheel's libnccl. The stand-in image is removed afterwards.

`clean` removes what a run may have left: working containers (and their mounts) and the names of
the images built from the Dockerfile. The base and the layers stay, as the next build's cache
(named localhost/horovod-layer-cache:cpu and :gpu-standin; an older build's layers are removed).

Storage: CACHE/storage (overlay driver), run state in RUNROOT; CACHE is /var/cache/horovod-image.
Exit status 0 when everything passed, 1 with the reason otherwise.
"""

import argparse
import hashlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bare_install  # noqa: E402  (the debootstrap'd root and the wheelhouse, shared with bare-install)

REPO = pathlib.Path(__file__).resolve().parents[1]
CACHE = pathlib.Path("/var/cache/horovod-image")
RUNROOT = pathlib.Path("/run/horovod-image")
BUILDAH = ["buildah", "--root", str(CACHE / "storage"), "--runroot", str(RUNROOT), "--storage-driver", "overlay"]
BASE = "localhost/horovod-base:bookworm"
IMAGE = "localhost/horovod:cpu"
GPU_STANDIN = "localhost/horovod:gpu-standin"
BUILT = [IMAGE, GPU_STANDIN]
LAYER_CACHE = "localhost/horovod-layer-cache:"
NCCL_WHEEL = "nvidia-nccl-cu13"
# The image's non-root user (docker/Dockerfile's USER and UID).
USER, UID = "mpiuser", 1000
# Each image's containers are named after the run that made them, so that `clean` finds them.
CONTAINER_PREFIX = "hvd-image-"


def log(message: str) -> None:
    print(f"image: {message}", flush=True)


class Failure(Exception):
    pass


def buildah(*args: str, capture: bool = False) -> str:
    log("$ buildah " + shlex.join(args))
    proc = subprocess.run([*BUILDAH, *args], stdout=subprocess.PIPE if capture else None, text=True)
    if proc.returncode != 0:
        raise Failure(f"buildah {shlex.join(args[:2])}... exited with status {proc.returncode}")
    return (proc.stdout or "").strip()


def image_id(name: str) -> str | None:
    proc = subprocess.run([*BUILDAH, "inspect", "--type", "image", "--format", "{{.FromImageID}}", name],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_base() -> None:
    """localhost/horovod-base:bookworm, imported from bare-install's Debian root when missing or
    when the root's recipe changed."""
    root = bare_install.ensure_root(bare_install.CACHE)
    stamp = CACHE / "base.recipe"
    wanted = hashlib.sha256(bare_install.recipe().encode()).hexdigest()
    known = image_id(BASE)
    if known and stamp.is_file() and stamp.read_text().split() == [wanted, known]:
        log(f"{BASE} ({known[:12]}) is up to date with the Debian root's recipe")
        return
    started = time.monotonic()
    container = buildah("from", "--name", f"{CONTAINER_PREFIX}base-{os.getpid()}", "scratch", capture=True)
    try:
        mount = buildah("mount", container, capture=True)
        try:
            # cp -a keeps owners, modes, links and devices; the root holds no mount points.
            if subprocess.run(["cp", "-a", f"{root}/.", mount]).returncode != 0:
                raise Failure(f"copying {root} into the base image failed")
        finally:
            buildah("umount", container)
        buildah("config", "--label", f"org.horovod.base-recipe={wanted}", container)
        buildah("commit", "--quiet", container, BASE, capture=True)
    finally:
        subprocess.run([*BUILDAH, "rm", container], capture_output=True)
    stamp.write_text(f"{wanted} {image_id(BASE)}\n")
    log(f"imported {root} as {BASE} in {time.monotonic() - started:.0f} s")


def ensure_gpu_wheelhouse() -> pathlib.Path:
    house, stamp = CACHE / "wheelhouse-gpu", CACHE / "wheelhouse-gpu.requirements"
    if house.is_dir() and stamp.is_file() and stamp.read_text().strip() == NCCL_WHEEL:
        return house
    house.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary", ":all:", "--no-deps", "--dest", str(house),
           NCCL_WHEEL]
    log("$ " + shlex.join(cmd))
    if subprocess.run(cmd).returncode != 0:
        raise Failure(f"pip download {NCCL_WHEEL} failed")
    stamp.write_text(NCCL_WHEEL + "\n")
    return house


def bud(tag: str, volumes: dict[pathlib.Path, str], build_args: dict[str, str]) -> float:
    started = time.monotonic()
    args = ["bud", "--isolation", "chroot", "--layers", "--network", "host", "-f", str(REPO / "docker" / "Dockerfile"),
            "-t", tag]
    for host, inside in volumes.items():
        args += ["-v", f"{host}:{inside}:ro"]
    for name, value in build_args.items():
        args += ["--build-arg", f"{name}={value}"]
    buildah(*args, str(REPO))
    return time.monotonic() - started


def run_in(image: str, script: str) -> str:
    """`script` (Python) run by the image's user in a throw-away container of `image`: its root
    mounted and entered with chroot inside new mount and PID namespaces. Returns its stdout."""
    container = buildah("from", "--name", f"{CONTAINER_PREFIX}check-{os.getpid()}", image, capture=True)
    try:
        mount = buildah("mount", container, capture=True)
        try:
            inner = (f"mount -t proc proc {shlex.quote(mount)}/proc && "
                     f"chroot --userspec={UID}:{UID} {shlex.quote(mount)} /usr/bin/env -i HOME=/home/{USER} "
                     f"PATH=/opt/horovod/bin:/usr/bin:/bin python -c {shlex.quote(script)}")
            proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--",
                                   "sh", "-c", inner], capture_output=True, text=True)
        finally:
            buildah("umount", container)
    finally:
        subprocess.run([*BUILDAH, "rm", container], capture_output=True)
    if proc.returncode != 0:
        raise Failure(f"the check in {image} failed (status {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


# Run in the GPU stand-in: the core must be the NCCL build and load the NCCL of the wheel.
GPU_CHECK = r"""
import json, pathlib
from horovod.common import _core, util
import nvidia.nccl
nccl = pathlib.Path(list(nvidia.nccl.__path__)[0])
code = int(next(line.split()[2] for line in (nccl / "include" / "nccl.h").read_text().splitlines()
                if line.startswith("#define NCCL_VERSION_CODE")))
assert util.cuda_built() is True, util.cuda_built()
assert util.nccl_built() == code, (util.nccl_built(), code)
print(json.dumps({"nccl_built": util.nccl_built(), "cuda_built": util.cuda_built(), "gpu": _core.gpu_error()}))
"""


def build(dist: pathlib.Path, gpu_dist: pathlib.Path) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = bare_install.project_wheels(dist)
    ensure_base()
    house = bare_install.ensure_wheelhouse(bare_install.CACHE, wheels)
    # Both builds see both wheelhouses with the same PIP_ARGS, so that they share the layers up to
    # the first that differs (PyTorch's, the largest, is the same CPU build in both).
    offline = {house: "/wheelhouse", ensure_gpu_wheelhouse(): "/wheelhouse-gpu"}
    pip_args = "--no-index --find-links /wheelhouse --find-links /wheelhouse-gpu"
    seconds = bud(IMAGE, offline, {"BASE": BASE, "PIP_ARGS": pip_args})
    log(f"built {IMAGE} in {seconds:.0f} s")

    gpu_wheels = sorted(gpu_dist.glob("horovod_core-*manylinux*.whl"))
    if len(gpu_wheels) != 1:
        raise Failure(f"expected one repaired horovod-core wheel in {gpu_dist}, found {len(gpu_wheels)}: "
                      "run nox -s build-gpu first")
    try:
        context_dir = gpu_dist.resolve().relative_to(REPO)
    except ValueError:
        raise Failure(f"{gpu_dist} must be inside the build context {REPO}") from None
    seconds = bud(GPU_STANDIN, offline, {"BASE": BASE, "CORE_WHEELS": str(context_dir),
                                         "FRAMEWORKS": f"scikit-learn {NCCL_WHEEL}", "PIP_ARGS": pip_args})
    try:
        found = json.loads(run_in(GPU_STANDIN, GPU_CHECK).strip().splitlines()[-1])
    finally:
        keep_as_cache(GPU_STANDIN)
    log(f"GPU variant on the stand-in base: built in {seconds:.0f} s; in it, nccl_built() = {found['nccl_built']}, "
        f"cuda_built() = {found['cuda_built']}, GPU: {found['gpu'] or 'usable'}")


def keep_as_cache(tag: str) -> None:
    """Removes the name ``tag`` but keeps its layers as the next build's cache: the image is
    named localhost/horovod-layer-cache:<variant> instead (`buildah rmi` of an image's only name
    would remove the intermediate images of its chain too, the build's cache)."""
    if image_id(tag):
        subprocess.run([*BUILDAH, "tag", tag, LAYER_CACHE + tag.rsplit(":", 1)[1]], check=True, capture_output=True)
        subprocess.run([*BUILDAH, "rmi", tag], check=True, capture_output=True)


def clean() -> None:
    """Every working container of the image storage (a failed build's included), unmounted and
    removed; the built tags; then the storage's own mount of its overlay folder and the run
    state, so that no mount is left. The base and the layer cache stay."""
    listed = subprocess.run([*BUILDAH, "containers", "--all", "--json"], capture_output=True, text=True)
    for container in (json.loads(listed.stdout or "null") or []) if listed.returncode == 0 else []:
        subprocess.run([*BUILDAH, "umount", container["id"]], capture_output=True)
        subprocess.run([*BUILDAH, "rm", container["id"]], capture_output=True)
    for tag in BUILT:
        keep_as_cache(tag)
    # The chains of layers that no cache name holds any more (an older build's): removed.
    subprocess.run([*BUILDAH, "rmi", "--prune"], capture_output=True)
    overlay = CACHE / "storage" / "overlay"
    with open("/proc/self/mountinfo") as f:
        mounted = [line.split()[4] for line in f]
    left = [point for point in mounted if point.startswith(str(overlay) + "/")]
    if left:
        raise Failure(f"still mounted after removing the containers: {', '.join(left)}")
    if str(overlay) in mounted:
        subprocess.run(["umount", str(overlay)], check=True)
    shutil.rmtree(RUNROOT, ignore_errors=True)
    log("no container, mount or built tag of the image storage is left")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["build", "clean"])
    parser.add_argument("--dist", type=pathlib.Path, default=REPO / "dist", help="the project's wheels")
    parser.add_argument("--gpu-dist", type=pathlib.Path, default=REPO / "build" / "gpu-dist",
                        help="the core wheel built with NCCL (nox -s build-gpu)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("image: needs root (buildah's storage under /var/cache, chroot and mounts)", file=sys.stderr)
        return 1
    try:
        if args.action == "build":
            build(args.dist.resolve(), args.gpu_dist)
        else:
            clean()
    except (Failure, bare_install.Failure) as e:
        print(f"image: FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
