#!/usr/bin/env python3
"""Make the libnl copies that `auditwheel repair` vendored into a wheel bind to themselves.

Gloo links libibverbs, which links libnl-3 and libnl-route-3, so the repaired horovod-core wheel
carries private copies of both (horovod_core.libs/). libnl-route registers its traffic-control
modules from load-time constructors and unregisters them at exit. In a process that has already
loaded the system's libnl-route into the global scope (Open MPI does, under `mpirun`, when mpi4py
is imported before horovod), the vendored copy's constructors and destructors resolved to the
system copy's functions, and the process crashed at exit in `rtnl_tc_unregister` (SIGSEGV, exit
status 139, after the script had finished).

This sets DF_SYMBOLIC (a library's references to its own symbols resolve within itself first)
and DF_BIND_NOW (everything else is resolved once, at load time, so a constructor and its
destructor always reach the same library) on those copies. Each copy then keeps its own module
lists and the system's copy is untouched. The ELF dynamic section is edited with LIEF
(https://lief.re); the wheel is unpacked and packed again with `wheel` (which rewrites RECORD).

    python ci/bind_vendored_libs.py dist/horovod_core-*.whl
"""

import pathlib
import subprocess
import sys
import tempfile

import lief

# The vendored libraries to mark, by the name their soname starts with (auditwheel appends a hash).
PREFIXES = ("libnl-3-", "libnl-route-3-")
DF_SYMBOLIC = 0x2
DF_BIND_NOW = 0x8


def mark(library: pathlib.Path) -> None:
    binary = lief.ELF.parse(str(library))
    if binary is None:
        raise SystemExit(f"{library}: not an ELF file LIEF can read")
    flags = binary.get(lief.ELF.DynamicEntry.TAG.FLAGS)
    if flags is None:
        binary.add(lief.ELF.DynamicEntry(lief.ELF.DynamicEntry.TAG.FLAGS, DF_SYMBOLIC | DF_BIND_NOW))
    else:
        flags.value = flags.value | DF_SYMBOLIC | DF_BIND_NOW
    binary.write(str(library))
    check = lief.ELF.parse(str(library)).get(lief.ELF.DynamicEntry.TAG.FLAGS)
    if check is None or check.value & (DF_SYMBOLIC | DF_BIND_NOW) != DF_SYMBOLIC | DF_BIND_NOW:
        raise SystemExit(f"{library}: DT_FLAGS not set after writing")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    wheel = pathlib.Path(sys.argv[1]).resolve()
    with tempfile.TemporaryDirectory(prefix="hvd-bind-") as tmp:
        subprocess.run([sys.executable, "-m", "wheel", "unpack", "--dest", tmp, str(wheel)], check=True,
                       stdout=subprocess.DEVNULL)
        (root,) = pathlib.Path(tmp).iterdir()
        marked = sorted(lib for lib in root.glob("*.libs/*") if lib.name.startswith(PREFIXES))
        if len(marked) != len(PREFIXES):
            found = sorted(lib.name for lib in root.glob("*.libs/*"))
            raise SystemExit(f"{wheel.name}: expected one vendored library starting with each of {PREFIXES}, "
                             f"found {found}")
        for library in marked:
            mark(library)
        wheel.unlink()
        subprocess.run([sys.executable, "-m", "wheel", "pack", "--dest-dir", str(wheel.parent), str(root)],
                       check=True, stdout=subprocess.DEVNULL)
    if not wheel.exists():
        raise SystemExit(f"wheel pack did not write {wheel}")
    print(f"{wheel.name}: DF_SYMBOLIC | DF_BIND_NOW on {', '.join(lib.name for lib in marked)}")


if __name__ == "__main__":
    main()
