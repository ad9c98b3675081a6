"""The engine's layer rules and size limits (packages/horovod-core/csrc), checked by `nox -s lint`.

1. Floors: the folders of csrc are floors (FLOORS), bottom to top: common/ (1), backends/ (2),
   executors/ (3), collectives/ (4), engine/ (5), bindings/ and bindings.cc (6). A file includes
   only files of its own floor or lower ones, never one above it. csrc/tests/ is exempt; a file
   of csrc in no floor is an error (a new folder gets its floor here).
2. Interfaces: the engine (floor 5) sees the floors it drives only through their interfaces
   (INTERFACES): it may include common/ freely, but of backends/, executors/ and collectives/
   only the headers listed.
3. No include pair: two files of csrc that include each other.
4. No file of csrc over MAX_LINES lines.
5. engine/engine.cc and bindings.cc under their own, lower limits (LIMITS): the engine's cycle
   and the bindings stay thin; their work belongs in the layers below.

KNOWN holds today's exceptions with the size each had when it was listed: such a file may not
grow, and its entry must go once the file is within the limit (the check says so), so the list
only shrinks as the refactor of issue 41 continues. Run: python ci/check_layers.py
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CSRC = ROOT / "packages" / "horovod-core" / "csrc"
SUFFIXES = {".h", ".cc", ".cu", ".cuh"}
MAX_LINES = 600
LIMITS = {"engine/engine.cc": 400, "bindings.cc": 400}
# Files over their limit today, with their size then (lines): they may shrink, never grow.
KNOWN = {}
# Floor of each top-level folder (or file) of csrc, bottom to top.
FLOORS = {
    "common": 1,
    "backends": 2,
    "executors": 3,
    "collectives": 4,
    "engine": 5,
    "bindings": 6,
    "bindings.cc": 6,
}
EXEMPT = {"tests"}
# What the engine may include of the floors it drives.
INTERFACES = {
    "engine": {
        "backends/communicator.h",
        "backends/registry.h",
        "backends/communicator_stack.h",
        "executors/device_executor.h",
        "executors/gpu_error.h",
        "collectives/collective.h",
    },
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in SUFFIXES and p.is_file())


def includes(path):
    """The csrc files that `path` includes: "a/b.h" from the csrc root, else beside `path`."""
    found = set()
    for name in INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
        for candidate in (CSRC / name, path.parent / name):
            if candidate.is_file():
                found.add(candidate.resolve().relative_to(CSRC).as_posix())
                break
    return found


def top(name):
    """The top-level folder (or file) of csrc that `name` lies in."""
    return name.split("/", 1)[0]


def check_floors(graph):
    errors = []
    for name, targets in graph.items():
        if top(name) in EXEMPT:
            continue
        floor = FLOORS.get(top(name))
        if floor is None:
            errors.append(f"{name}: in no floor of csrc (add its folder to FLOORS)")
            continue
        allowed = INTERFACES.get(top(name))
        for target in sorted(targets):
            target_floor = FLOORS.get(top(target))
            if target_floor is None:
                continue  # reported as a file of its own
            if target_floor > floor:
                errors.append(f"{name} (floor {floor}, {top(name)}) includes {target} "
                              f"(floor {target_floor}, {top(target)}): no include from a lower floor to a higher one")
            elif (allowed is not None and top(target) not in (top(name), "common") and target not in allowed):
                errors.append(f"{name} includes {target}: {top(name)}/ includes {top(target)}/ only through "
                              f"its interfaces ({', '.join(sorted(t for t in allowed if top(t) == top(target)))})")
    return errors


def check():
    errors = []
    files = {p.relative_to(CSRC).as_posix(): p for p in sources()}
    graph = {name: includes(path) for name, path in files.items()}
    errors += check_floors(graph)
    for name, targets in graph.items():
        for target in sorted(targets):
            if name < target and name in graph.get(target, ()):
                errors.append(f"{name} and {target} include each other")
    for name, path in files.items():
        lines = len(path.read_text(encoding="utf-8", errors="replace").splitlines())
        limit = LIMITS.get(name, MAX_LINES)
        known = KNOWN.get(name)
        if known is not None:
            if lines <= limit:
                errors.append(f"{name}: {lines} lines, within its limit of {limit}: remove it from KNOWN")
            elif lines > known:
                errors.append(f"{name}: {lines} lines, more than the {known} it had when listed in KNOWN "
                              f"(limit {limit}): it may only shrink")
        elif lines > limit:
            errors.append(f"{name}: {lines} lines, over the limit of {limit}")
    for name in sorted(set(KNOWN) - set(files)):
        errors.append(f"{name}: listed in KNOWN but not in csrc: remove it")
    return errors


def main():
    errors = check()
    for error in errors:
        print(f"check_layers: {error}", file=sys.stderr)
    if errors:
        print(f"check_layers: {len(errors)} problem(s); the rules are in {pathlib.Path(__file__).name}'s docstring",
              file=sys.stderr)
        return 1
    print(f"check_layers: {len(list(sources()))} files of csrc within their limits, no upward include, "
          f"no include pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
