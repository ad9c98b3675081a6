"""Reads the flight recorder files of a job's ranks and says where the ranks diverged.

Each rank's engine keeps its last operations (``HOROVOD_FLIGHT_RECORDER_SIZE``, default 1024) and
writes them as ``flight_recorder_rank_<rank>.json`` to ``HOROVOD_FLIGHT_RECORDER_DIR`` on a
deadlock, mismatch or stall error, a lost peer, ``SIGUSR2`` or ``hvd.dump_flight_recorder()``
(format: docs/engine.md, "Flight recorder"). ``horovodrun`` gathers the files when a job fails and
prints :func:`diagnose`'s text; for files collected by hand::

    python -m horovod.runner.flight_recorder DIR

The diagnosis compares, per process set, the operations the ranks submitted in order (every rank
numbers its submissions to a set 0, 1, 2, ...): the first position where the ranks submitted
different operations, or where some rank submitted nothing, is where they diverged; for each
operation there, it names the ranks that never submitted it. Ranks without a file (a rank that
died, or whose host could not be reached) are named too.
"""

import argparse
import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid

from horovod.runner.common.util import env_names

FILE_PREFIX = "flight_recorder_rank_"
FORMAT = "horovod-flight-recorder"
GATHER_TIMEOUT_S = 30


def load(*directories):
    """The newest file of each rank under ``directories`` (searched recursively, so that the
    files gathered from several hosts into subdirectories are found).

    Args:
        directories (str or os.PathLike): where the files are.

    Returns:
        dict: global rank (int) -> the file's JSON object.

    Raises:
        ValueError: one of ``directories`` is not a directory, or a file is not a flight recorder
            file.
    """
    paths = []
    for directory in map(os.fspath, directories):
        if not os.path.isdir(directory):
            raise ValueError(f"{directory!r} is not a directory")
        for root, _, names in os.walk(directory):
            paths += [os.path.join(root, name) for name in sorted(names)
                      if name.startswith(FILE_PREFIX) and name.endswith(".json")]
    by_rank = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the flight recorder file {path}: {e}") from e
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise ValueError(f"{path} is not a Horovod flight recorder file")
        rank = int(record["rank"])
        if rank not in by_rank or record.get("dumped_us", 0) > by_rank[rank].get("dumped_us", 0):
            by_rank[rank] = record
    return by_rank


def _describe(op):
    shape = "[" + ", ".join(str(d) for d in op["shape"]) + "]"
    return f"{op['name']} ({op['collective']}, {op['dtype']} {shape}, {op['outcome']})"


def _rank_label(rank, records):
    host = records[rank].get("host") if rank in records else None
    return f"rank {rank} (host {host})" if host else f"rank {rank}"


def diagnose(records):
    """The diagnosis of ``records`` (:func:`load`'s result) as lines of text.

    For each process set with recorded operations: the first operation number at which the ranks'
    submissions differ (each rank's operation there, and which ranks never submitted each of
    them), or, when they never differ, each rank's unfinished operations. Also the ranks that left
    no file.
    """
    if not records:
        return ["Flight recorder: no files found."]
    size = max(int(r.get("size", 0)) for r in records.values())
    ranks = sorted(records)
    lines = [f"Flight recorder: files of rank{'s' if len(ranks) > 1 else ''} "
             f"{', '.join(str(r) for r in ranks)} (job of {size})."]
    missing = [r for r in range(size) if r not in records]
    if missing:
        lines.append(f"No file from rank{'s' if len(missing) > 1 else ''} {', '.join(str(r) for r in missing)}: "
                     "they died, hung outside Horovod, or their host could not be reached.")
    set_members = {}
    for record in records.values():
        for set_id, members in record.get("process_sets", {}).items():
            set_members[int(set_id)] = [int(m) for m in members]
    per_set = {}
    for rank, record in records.items():
        for op in record.get("operations", []):
            per_set.setdefault(int(op["process_set"]), {}).setdefault(rank, {})[int(op["seq"])] = op
    found = False
    for set_id in sorted(per_set):
        members = set_members.get(set_id) or sorted(per_set[set_id])
        present = [r for r in members if r in records]
        ops = {r: per_set[set_id].get(r, {}) for r in present}
        heading = f"Process set {set_id} (ranks {', '.join(str(m) for m in members)})"
        # Compare only where every rank's ring still holds its operations.
        first = max((min(o) for o in ops.values() if o), default=0)
        last = max((max(o) for o in ops.values() if o), default=-1)
        for seq in range(first, last + 1):
            at = {r: ops[r].get(seq) for r in present}
            kinds = {(op["name"], op["collective"]) if op else None for op in at.values()}
            if len(kinds) == 1:
                continue
            found = True
            lines.append(f"{heading}: the ranks diverged at operation #{seq}:")
            for r in present:
                op = at[r]
                if op is not None:
                    lines.append(f"  {_rank_label(r, records)}: {_describe(op)}")
                else:
                    lines.append(f"  {_rank_label(r, records)}: submitted nothing as operation #{seq}")
            for name in sorted({op["name"] for op in at.values() if op}):
                never = [r for r in present if not any(o["name"] == name for o in ops[r].values())]
                if never:
                    lines.append(f"  {name} was never submitted by rank{'s' if len(never) > 1 else ''} "
                                 f"{', '.join(str(r) for r in never)}")
            break
        else:
            unfinished = [(r, op) for r in present for op in ops[r].values() if op["outcome"] != "completed"]
            if unfinished:
                found = True
                lines.append(f"{heading}: the ranks submitted the same operations; unfinished or failed:")
                for r, op in sorted(unfinished, key=lambda item: (item[0], item[1]["seq"])):
                    lines.append(f"  {_rank_label(r, records)}: #{op['seq']} {_describe(op)}")
    if not found:
        lines.append("No divergence: every rank submitted the same operations, and all of them completed.")
    errors = sorted({op.get("error") for record in records.values() for op in record.get("operations", [])
                     if op.get("error")})
    if errors:
        lines.append("Errors recorded: " + errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    return lines


def _ssh(host, settings, command):
    """Runs ``command`` on ``host`` over ssh; its stdout (bytes), or None after reporting why not
    (ssh could not connect, exit status 255, or did not finish within ``GATHER_TIMEOUT_S``)."""
    from horovod.runner.util import remote
    argv = remote.ssh_argv(host, settings.ssh_port, settings.ssh_identity_file, timeout_s=10) + [command]
    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=GATHER_TIMEOUT_S,
                                check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"horovodrun: could not reach {host} for its flight recorder files: {e}", file=sys.stderr)
        return None
    if result.returncode == 255:
        reason = result.stderr.decode(errors="replace").strip() or "ssh exited with 255"
        print(f"horovodrun: could not reach {host} for its flight recorder files: {reason}", file=sys.stderr)
        return None
    return result.stdout


def _gather_remote(directory, host, settings, target):
    """Copies ``host``'s files from ``directory`` (the same path there) into ``target`` here.
    Returns whether ``host`` answered."""
    archive = _ssh(host, settings, f"cd {shlex.quote(directory)} 2>/dev/null && "
                                   f"tar -cf - --wildcards '{FILE_PREFIX}*.json' 2>/dev/null")
    if archive is None:
        return False
    if not archive:
        return True
    os.makedirs(target, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as files:
            files.extractall(target, filter="data")
    except tarfile.TarError as e:
        print(f"horovodrun: could not read the flight recorder files of {host}: {e}", file=sys.stderr)
    return True


def _on_every_host(fn, hosts):
    """``fn(host)`` for every host at once (each may wait for ssh's connection timeout); the
    results in the order of ``hosts``."""
    from horovod.runner.util import threads
    results = threads.execute_function_multithreaded(fn, [(host,) for host in hosts])
    return [results[index] for index in range(len(hosts))]


@contextlib.contextmanager
def recorded_job(env, settings, remote_hosts):
    """Around a static job launched by ``horovodrun``: points the workers at a flight recorder
    directory (``HOROVOD_FLIGHT_RECORDER_DIR`` of ``env``, or a temporary one, the same path on
    every host), and when the job fails (the body raises) gathers the ranks' files from the remote
    hosts over ssh and prints the diagnosis to stderr before the error goes on. The files of a
    remote host go to ``<dir>/host-<host>/`` here. A temporary directory is removed afterwards
    (on the remote hosts when the job failed; files written on demand on remote hosts by a job
    that succeeded stay there: set the variable to choose where).

    Args:
        env (dict): the workers' environment; ``HOROVOD_FLIGHT_RECORDER_DIR`` is set in it.
        settings: the job's settings (``ssh_port``, ``ssh_identity_file``).
        remote_hosts (list of str): the hosts that are not this one.
    """
    if env.get(env_names.FLIGHT_RECORDER_SIZE, "").strip() == "0":
        yield
        return
    directory = env.get(env_names.FLIGHT_RECORDER_DIR)
    temporary = not directory
    if temporary:
        # Only named here: a rank creates it when it writes its file (on an error), so that a
        # launcher killed with SIGKILL leaves nothing behind unless something failed.
        directory = os.path.join(tempfile.gettempdir(), f"horovod-flight-recorder-{uuid.uuid4().hex[:12]}")
        env[env_names.FLIGHT_RECORDER_DIR] = directory
    try:
        yield
    except BaseException:
        # A temporary directory may be shared with remote hosts (one file system): their copies go
        # elsewhere, and the directory is removed on them only once everything was read.
        gathered = tempfile.mkdtemp(prefix="horovod-flight-recorder-gathered-") if temporary else directory
        # The hosts that answered: one that did not (its sshd or network is down) is not asked
        # again to remove the directory, which would only wait for ssh's timeout once more.
        answered = []
        try:
            hosts = list(remote_hosts)
            reached = _on_every_host(
                lambda host: _gather_remote(directory, host, settings, os.path.join(gathered, f"host-{host}")),
                hosts)
            answered = [host for host, ok in zip(hosts, reached, strict=True) if ok]
            records = load(*[d for d in (directory, gathered) if os.path.isdir(d)])
            if records:
                where = "" if temporary else f" (files in {directory})"
                print(f"horovodrun: the job failed; its flight recorder{where} says:\n  " +
                      "\n  ".join(diagnose(records)), file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 - the job's own error matters more
            print(f"horovodrun: could not analyse the flight recorder files: {e}", file=sys.stderr)
        finally:
            if temporary:
                shutil.rmtree(gathered, ignore_errors=True)
                _on_every_host(lambda host: _ssh(host, settings, f"rm -rf {shlex.quote(directory)}"), answered)
        raise
    finally:
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m horovod.runner.flight_recorder",
        description="Say where the ranks of a Horovod job diverged, from their flight recorder files "
                    "(flight_recorder_rank_<rank>.json, searched recursively).")
    parser.add_argument("directory", help="directory holding the ranks' files")
    args = parser.parse_args(argv)
    try:
        records = load(args.directory)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(diagnose(records)))
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
