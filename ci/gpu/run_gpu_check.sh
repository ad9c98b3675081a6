#!/bin/bash
# The GPU check on a machine with a GPU but without this project's build dependencies (the device
# machine of docs/gpu.md). Builds horovod-core with NCCL from this tree, then runs, at np=1:
# ci/gpu/gpu_check.py (every collective through horovod.common.ops on CuPy arrays, with batched
# copies and without), ci/gpu/caller_execution_check.py, hvd.init() with torch imported first, and
# the GPU tests of horovod-core and horovod-torch. Run from the repository root with OUT set to a
# folder for the build log. It expects build/devdeps/: usr/ with the files of Debian 12's
# libgloo-dev, libgloo0, libeigen3-dev and liblbfgspp-dev (`apt-get download` + `dpkg -x`), and
# deplibs/ with the shared libraries Gloo links (libhiredis.so.0.14, libibverbs.so.1,
# libnl-3.so.200, libnl-route-3.so.200), copied to the machine with the working tree.
set -u
ROOT=$PWD
DEPS=$ROOT/build/devdeps
export LD_LIBRARY_PATH=$DEPS/deplibs:$DEPS/usr/lib:${LD_LIBRARY_PATH:-}
export CMAKE_PREFIX_PATH=$DEPS/usr
cp -rn $DEPS/usr/. /usr/ 2>/dev/null
nvidia-smi -L
PY=python3
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$SITE/nvidia/nccl CUDAARCHS=90 HOROVOD_WITHOUT_MPI=1
export CUDACXX=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
export CMAKE_BUILD_PARALLEL_LEVEL=16 SKBUILD_BUILD_DIR=/tmp/hvd-gpu-build
mkdir -p /tmp/hvdw
$PY -m pip wheel -q --no-deps --no-build-isolation --wheel-dir /tmp/hvdw packages/horovod-core > $OUT/build.log 2>&1 || { tail -60 $OUT/build.log; exit 1; }
$PY -m pip install -q --upgrade --no-deps --no-index --target /tmp/site /tmp/hvdw/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
echo "== gpu_check.py: 3 runs with batched copies, 1 without"
for i in 1 2 3; do timeout 120 $PY $ROOT/ci/gpu/gpu_check.py 2>&1 | tail -3; done
HOROVOD_BATCH_D2D_MEMCOPIES=0 timeout 120 $PY $ROOT/ci/gpu/gpu_check.py 2>&1 | tail -3
echo "== caller_execution_check.py"
timeout 120 $PY $ROOT/ci/gpu/caller_execution_check.py 2>&1 | tail -3
echo "== hvd.init() with torch imported first"
PYTHONPATH=/tmp/site:$ROOT/packages/horovod-torch/src timeout 60 $PY -X faulthandler -c "import torch; import horovod.torch as hvd; hvd.init(); \
x = hvd.allreduce(torch.arange(4.0, device='cuda')); assert x.is_cuda and x.tolist() == [0, 1, 2, 3]; \
hvd.shutdown(); print('TORCH FIRST OK')" 2>&1 | tail -8
echo "== GPU tests"
export PYTHONPATH=/tmp/site:$ROOT/packages/horovod-torch/src:$ROOT/packages/horovod-run/src:$ROOT/packages/horovod-testing/src
(cd $ROOT/packages/horovod-core/tests && timeout 200 $PY -m pytest -q -p no:cacheprovider -rs test_gpu.py 2>&1 | tail -12)
(cd $ROOT/packages/horovod-torch/tests && PYTHONPATH=$PYTHONPATH:$PWD timeout 300 $PY -m pytest -q -p no:cacheprovider -rs test_gpu.py 2>&1 | tail -12)
