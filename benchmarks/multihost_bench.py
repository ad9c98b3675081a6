"""Allreduce across hosts: Horovod flat and hierarchical, torch.distributed (Gloo) and raw MPI
(mpi4py), in the same processes.

Run one process per rank under an MPI launch across hosts, so that mpi4py sees every rank:

    HOROVOD_GLOO_IFACE=hvdbr0 horovodrun --mpi -np 4 -H 198.18.0.1:2,198.18.0.2:2 \\
        --network-interfaces hvdbr0 python benchmarks/multihost_bench.py --label unshaped \\
        --json benchmarks/results/multihost-2x2.json --markdown benchmarks/results/multihost-2x2.md

Horovod runs over Gloo as under ``horovodrun --gloo``: rank 0 starts the launcher's rendezvous
service (horovod.runner's RendezvousServer) on its address on HOROVOD_GLOO_IFACE and every rank
takes the variables horovodrun --gloo would give it (horovod.runner.gloo_run's functions; hosts by
host name, in rank order). Under ``horovodrun --gloo`` the program runs too, without the mpi4py
column. Each Horovod configuration of --horovod (gloo, gloo-hierarchical, mpi, mpi-hierarchical:
the backend, and HOROVOD_HIERARCHICAL_ALLREDUCE; a Gloo one with :poll or :sleep sets
HOROVOD_GLOO_BUSY_POLL to 1 or 0) is initialised for each of its measurements and
shut down after it, so the configurations and the other libraries take turns at every size;
engine_stats confirms that each ran the path it names. torch.distributed joins its group at rank
0's address on HOROVOD_GLOO_IFACE.

The measurements, columns and formulas are allreduce_bench's (report.measure; benchmarks/README.md).
--json adds this run to the file under --label (replacing a run of the same label) and --markdown
writes every run of that file (--rewrite: only that, from the file, measuring nothing). Each run
records the hosts, each host's qdisc on the interface (the test bed's shaping: ci/testbed.sh
shape-rate), the machine, the share of the cores other processes took, and --command / --note as
given. At the end rank 0 compares, at every size of at least 64 KiB, each flat Horovod configuration with raw MPI
and torch.distributed (goal: at least their bus bandwidth) and each hierarchical configuration with
the flat one of its backend (goal at 2 hosts x 2 ranks, shaped: 1.3 x).
"""

import argparse
import contextlib
import json
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist

import horovod.torch as hvd
import report
from allreduce_bench import Horovod, TorchGloo, init_torch_distributed, rendezvous_address
from allreduce_bench import job as torch_job
from horovod.common import _core

KIB = 1 << 10
GOAL_FROM_BYTES = 64 * KIB  # the goals are checked at this size and above
HIERARCHICAL_GOAL = 1.3


def mpi_world() -> int:
    """Processes of the MPI launch that started this one (1 without one), read without importing
    mpi4py, which would start a singleton MPI under another launcher."""
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")) or 1)


def host_rendezvous(comm, iface: str):
    """Under an MPI launch: the rendezvous service in rank 0 and, on every rank, the variables that
    horovodrun --gloo gives its workers, so that Horovod can run over Gloo next to mpi4py. Returns
    the service (rank 0) or None."""
    from horovod.common.rendezvous import SECRET_ENV
    from horovod.runner.common.util import hosts
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
    from horovod.runner.http.http_server import RendezvousServer
    from horovod.runner.util.network import get_driver_ip

    names = comm.allgather(socket.gethostname())
    counts = {name: names.count(name) for name in names}
    slots = hosts.get_host_assignments(hosts.parse_hosts(",".join(f"{h}:{c}" for h, c in counts.items())),
                                       len(names))
    if [slot.hostname for slot in slots] != names:
        sys.exit(f"multihost_bench: the ranks are not placed host by host ({names}); launch with -map-by slot")
    server, where = None, None
    if comm.Get_rank() == 0:
        server = RendezvousServer()
        port = server.start()
        server.init(slots)
        where = (get_driver_ip([iface]), port, server.secret.hex())
    addr, port, secret = comm.bcast(where, root=0)
    os.environ.update(create_run_env_vars(addr, [iface], port))
    os.environ.update(create_slot_env_vars(slots[comm.Get_rank()]))
    os.environ[SECRET_ENV] = secret
    return server


class HorovodConfig(Horovod):
    """allreduce_bench's Horovod in one configuration ("gloo", "mpi", "-hierarchical" added, and
    for Gloo ":poll" or ":sleep" to set HOROVOD_GLOO_BUSY_POLL instead of leaving it to "auto"),
    initialised for each measurement."""

    POLLING = {"": ("auto", ""), "poll": ("1", ", polling"), "sleep": ("0", ", sleeping")}

    def __init__(self, config: str):
        layout, _, polling = config.partition(":")
        backend, _, hierarchical = layout.partition("-")
        if (backend not in ("gloo", "mpi") or hierarchical not in ("", "hierarchical") or polling not in self.POLLING
                or (polling and backend != "gloo")):
            raise ValueError(f"unknown Horovod configuration {config!r}")
        busy_poll, self.suffix = self.POLLING[polling]
        self.backend, self.hierarchical = backend, bool(hierarchical)
        self.name = f"horovod {backend} {'hierarchical' if hierarchical else 'flat'}{self.suffix}"
        self.env = {"HOROVOD_CONTROLLER": backend, "HOROVOD_CPU_OPERATIONS": backend,
                    "HOROVOD_HIERARCHICAL_ALLREDUCE": "1" if hierarchical else "0",
                    "HOROVOD_GLOO_BUSY_POLL": busy_poll}

    @contextlib.contextmanager
    def session(self):
        os.environ.update(self.env)
        hvd.init()
        try:
            yield
            stats = _core.engine_stats()
            ran = (_core.backend_name(), stats["hierarchical_allreduces"] > 0, stats["shared_memory"])
            if ran != (self.backend, self.hierarchical, False) or stats["hosts"] < 2:
                raise RuntimeError(f"{self.name} ran backend {ran[0]}, hierarchical {ran[1]}, one-host shared "
                                   f"memory {ran[2]} on {stats['hosts']} host(s)")
        finally:
            hvd.shutdown()


class CpuUse:
    """What the machine's cores did while the measurements ran: the share of their time the job's
    processes used, other processes used (busy time in /proc/stat minus the job's: approximate, as
    interrupt time is left out), and the hypervisor stole. Every rank creates one, and calls
    shares() at the end; torch.distributed must be initialised."""

    def __init__(self):
        self.start = (time.monotonic(), self.machine(), self.job())

    @staticmethod
    def machine() -> tuple[float, float]:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, _irq, _softirq, steal = (int(v) for v in f.readline().split()[1:9])
        return (user + nice + system) / os.sysconf("SC_CLK_TCK"), steal / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def job() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        seconds = torch.tensor([usage.ru_utime + usage.ru_stime], dtype=torch.float64)
        dist.all_reduce(seconds)
        return seconds.item()

    def shares(self) -> dict:
        t0, (busy0, steal0), job0 = self.start
        t1, (busy1, steal1), job1 = time.monotonic(), self.machine(), self.job()
        capacity = (t1 - t0) * os.cpu_count()
        return {"seconds": round(t1 - t0, 1), "job": round((job1 - job0) / capacity, 3),
                "others": round(max(0.0, busy1 - busy0 - (job1 - job0)) / capacity, 3),
                "steal": round((steal1 - steal0) / capacity, 3)}


def describe_hosts(iface: str) -> list[dict]:
    """Each rank's host, address on `iface` and qdisc there (Horovod must be initialised)."""
    mine = {"rank": hvd.rank(), "host": socket.gethostname(), "address": rendezvous_address(),
            "qdisc": report.shaping(iface)}
    return hvd.allgather_object(mine, name="bench.hosts")


def goals(sweep: list[dict], libs: list) -> list[dict]:
    """Per size of at least GOAL_FROM_BYTES: busbw ratios of each flat Horovod configuration to
    each other library, and of each hierarchical one to the flat one of its backend."""
    names = {lib.name for lib in libs}
    pairs = []
    for lib in libs:
        if isinstance(lib, HorovodConfig) and not lib.hierarchical:
            pairs += [(lib.name, other.name, 1.0) for other in libs if not isinstance(other, HorovodConfig)]
        elif isinstance(lib, HorovodConfig):
            flat = f"horovod {lib.backend} flat{lib.suffix}"
            if flat in names:
                pairs.append((lib.name, flat, HIERARCHICAL_GOAL))
    busbw = {(r["library"], r["size"]): r["busbw_GBps"] for r in sweep}
    sizes = sorted({r["size"] for r in sweep if r["size"] >= GOAL_FROM_BYTES})
    out = []
    for library, versus, goal in pairs:
        ratios = [{"size": size, "ratio": busbw[library, size] / busbw[versus, size]} for size in sizes]
        short = [r for r in ratios if r["ratio"] < goal]
        out.append({"library": library, "versus": versus, "goal": goal, "ratios": ratios, "short": short,
                    "met": not short})
    return out


def size_text(nbytes: int) -> str:
    for unit, factor in (("MiB", 1 << 20), ("KiB", KIB)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor} {unit}"
    return f"{nbytes} B"


def goal_line(g: dict) -> str:
    verdict = "met" if g["met"] else "NOT met (short at " + ", ".join(
        f"{size_text(r['size'])}: {r['ratio']:.2f}" for r in g["short"]) + ")"
    scope = " (the goal at 2 hosts x 2 ranks, shaped)" if g["goal"] == HIERARCHICAL_GOAL else ""
    return (f"{g['library']} busbw >= {g['goal']} x {g['versus']}'s{scope} at every size >= "
            f"{size_text(GOAL_FROM_BYTES)}: {verdict}")


def add_run(path: str, run: dict) -> dict:
    """`path`'s runs with `run` in place of one of the same label, or added; written back."""
    results = {"runs": []}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    labels = [r["label"] for r in results["runs"]]
    if run["label"] in labels:
        results["runs"][labels.index(run["label"])] = run
    else:
        results["runs"].append(run)
    report.write_json(path, results)
    return results


def write_markdown(path: str, results: dict) -> None:
    first = results["runs"][0]
    layout = first["layout"]
    out = [f"# Allreduce across hosts, {layout['hosts']} hosts x {layout['ranks_per_host']} ranks", "",
           "Written by benchmarks/multihost_bench.py (benchmarks/README.md: what it measures, the columns, "
           "the commands). Each run below was one job: every library in the same processes, taking turns "
           "at each size.", ""]
    for run in results["runs"]:
        m, layout = run["machine"], run["layout"]
        out += [f"## {run['label']}", ""]
        if run.get("note"):
            out += [run["note"], ""]
        out += [f"Command: `{run['command']}`", "",
                "Hosts: " + "; ".join(f"rank {h['rank']} on {h['host']} ({h['address']}), qdisc on "
                                      f"{layout['iface']}: {h['qdisc']}" for h in run["hosts"]) + ".", ""]
        if m["np"] > m["cores"]:
            out += [f"**{m['np']} ranks on {m['cores']} cores: the job is oversubscribed** (every host is this "
                    "machine).", ""]
        use = m["cpu_use"]
        out += [f"The cores' time during the {use['seconds']:.0f} s of measurements: {use['job']:.0%} this job's "
                f"processes, about {use['others']:.0%} other processes, {use['steal']:.0%} stolen by the "
                f"hypervisor; load average (which counts this job's threads too) {m['load_average']} at the start, "
                f"{m['load_average_end']} at the end.",
                ""]
        out += report.markdown(run)
        out += ["", "Goals (ratios of bus bandwidth, same run):", "",
                "| size (B) | " + " | ".join(f"{g['library']} / {g['versus']}" for g in run["goals"]) + " |",
                "|---:|" + "---:|" * len(run["goals"])]
        for i, first in enumerate(run["goals"][0]["ratios"] if run["goals"] else []):
            out.append(f"| {first['size']} | " + " | ".join(f"{g['ratios'][i]['ratio']:.2f}" for g in run["goals"])
                       + " |")
        out += [""] + [f"* {goal_line(g)}" for g in run["goals"]] + [""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    report.add_arguments(parser)
    parser.add_argument("--horovod", default="gloo,gloo-hierarchical",
                        help="Horovod configurations, comma-separated: gloo, gloo-hierarchical, mpi, mpi-hierarchical; "
                        "a Gloo one may end in :poll or :sleep (HOROVOD_GLOO_BUSY_POLL=1 or 0 instead of auto)")
    parser.add_argument("--iface", default=os.environ.get("HOROVOD_GLOO_IFACE"),
                        help="the hosts' network interface (default: HOROVOD_GLOO_IFACE)")
    parser.add_argument("--label", default="run", help="the run's name in --json and --markdown")
    parser.add_argument("--command", default=" ".join(sys.argv), help="the launch command, as recorded")
    parser.add_argument("--note", default="", help="a remark recorded with the run")
    parser.add_argument("--rewrite", action="store_true",
                        help="measure nothing: write --markdown from the runs in --json")
    args = parser.parse_args()
    if args.rewrite:
        with open(args.json) as f:
            write_markdown(args.markdown, json.load(f))
        return
    if not args.iface:
        sys.exit("multihost_bench: give --iface or HOROVOD_GLOO_IFACE (the interface between the hosts)")

    if mpi_world() > 1:
        from mpi4py import MPI

        import mpi_allreduce_bench
        server = host_rendezvous(MPI.COMM_WORLD, args.iface)
    else:
        mpi_allreduce_bench = server = None
    os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "0"
    hvd.init()  # flat, for torch.distributed's rendezvous and the description
    machine = report.machine(hvd.size())  # before the measurements load the machine
    hosts = describe_hosts(args.iface)
    init_torch_distributed()
    layout = {"hosts": len({h["host"] for h in hosts}), "ranks_per_host": hvd.local_size(), "iface": args.iface}
    hvd.shutdown()

    libs = [HorovodConfig(c.strip()) for c in args.horovod.split(",")] + [TorchGloo()]
    if mpi_allreduce_bench:
        machine["mpi"] = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
        libs.append(mpi_allreduce_bench.Mpi4py())
        job = mpi_allreduce_bench.job()
    else:
        job = torch_job()
    cpu = CpuUse()
    sweep, many_small = report.measure(libs, job, args)
    machine["cpu_use"] = cpu.shares()
    machine["load_average_end"] = round(os.getloadavg()[0], 2)
    if job.rank == 0:
        run = {"label": args.label, "command": args.command, "note": args.note, "layout": layout, "hosts": hosts,
               "machine": machine, "allreduce": sweep, "many_small": many_small, "goals": goals(sweep, libs)}
        for g in run["goals"]:
            print("# " + goal_line(g), flush=True)
        results = add_run(args.json, run) if args.json else {"runs": [run]}
        if args.markdown:
            write_markdown(args.markdown, results)
    dist.destroy_process_group()
    if server:
        server.stop()


if __name__ == "__main__":
    main()
