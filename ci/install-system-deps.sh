#!/usr/bin/env bash
# Installs the Debian packages that building and testing the project need.
# Already-installed packages are detected with dpkg-query, so a ready machine costs no apt work.
# As root it runs apt-get itself; otherwise it prints the command to run and exits non-zero.
set -euo pipefail

packages=(
  g++           # C++17 compiler for horovod-core
  cmake         # scikit-build-core drives CMake (it falls back to the PyPI cmake if this is too old)
  ninja-build
  libgloo-dev   # the Gloo backend: collectives and the full mesh over TCP
  libgtest-dev  # GoogleTest, for the engine's C++ unit tests (nox -s tests-cpp)
  libopenmpi-dev  # the MPI backend plugin links Open MPI (CMake finds it through mpicc)
  openmpi-bin     # mpirun, for horovodrun --mpi and the MPI tests
  debootstrap     # the bare-install test's minimal Debian root (ci/bare_install.py)
  buildah         # the container image (docker/Dockerfile, ci/image.py: buildah bud --isolation chroot)
  libeigen3-dev   # autotune: linear algebra of the Gaussian process (header-only)
  liblbfgspp-dev  # autotune: L-BFGS-B for the acquisition function (header-only, over Eigen)
  libgomp1        # OpenMP and quadmath runtimes the MXNet 1.9.1 wheel links (tests-mxnet)
  libquadmath0
  openssh-server  # the multi-host test bed (ci/testbed.sh): an sshd per fake host, never the system's
  openssh-client  #   ssh, ssh-keygen, ssh-agent
  iproute2        #   ip (network namespaces, veths, bridge), ss, tc
  slurmctld       # the bed's Slurm mode (ci/testbed.sh slurm-up): a controller and a slurmd per host,
  slurmd          #   started by the bed with its own config, never the system's services
  slurm-client    #   srun, salloc, sbatch, scontrol, squeue, scancel
  munge           #   one munged with the bed's own key and socket (/etc/munge is left alone)
  chromium        # the docs session opens the built site in headless Chromium (docs/tests/test_browser.py)
  chromium-driver #   driven through Debian's chromedriver by selenium, so no browser is downloaded
)

# Debian's own Python needs its headers from a package; a python.org or pyenv build ships them.
if ! python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  packages+=(python3-dev)
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-system-deps: already installed: ${packages[*]}"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-system-deps: missing Debian packages: ${missing[*]}" >&2
  echo "install them with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Installing openssh-server starts the system's sshd unless policy-rc.d forbids it: the test bed
# needs only the binary, so services stay stopped while this installs (unless a policy is there).
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# install-system-deps: no service starts during its apt-get install\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}"
