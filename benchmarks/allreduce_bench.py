"""Allreduce of horovod.torch against torch.distributed's Gloo backend, in the same processes.

Run one process per rank under the launcher:

    horovodrun -np 2 -H localhost:2 python benchmarks/allreduce_bench.py --json out.json

torch.distributed joins its group at rank 0's address on HOROVOD_GLOO_IFACE (which horovodrun
sets), so the program also runs across hosts; without that variable, on 127.0.0.1.

Two measurements, each for both libraries:
1. a sweep of float32 sum allreduces from --min-bytes to --max-bytes (x --step-factor), in place:
   the median of --iters timed calls after --warmup calls, and one checked call per size;
2. many small tensors: --small-tensors tensors of --small-bytes submitted asynchronously, then all
   waited on; the median over --small-steps steps.

Columns and formulas: benchmarks/README.md.
"""

import argparse
import ipaddress
import os
import socket

import torch
import torch.distributed as dist

import horovod.torch as hvd
import report


def full(count: int, value: float) -> torch.Tensor:
    return torch.full((count,), value, dtype=torch.float32)


class Horovod:
    name = "horovod"
    buffer = staticmethod(full)

    def allreduce(self, tensor: torch.Tensor) -> None:
        hvd.allreduce_(tensor, op=hvd.Sum, name=f"bench.{tensor.numel()}")

    def allreduce_many(self, tensors: list[torch.Tensor]) -> None:
        handles = [
            hvd.allreduce_async_(t, op=hvd.Sum, name=f"bench.small.{i}")
            for i, t in enumerate(tensors)
        ]
        for handle in handles:
            hvd.synchronize(handle)


class TorchGloo:
    name = "torch.distributed gloo"
    buffer = staticmethod(full)

    def allreduce(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)

    def allreduce_many(self, tensors: list[torch.Tensor]) -> None:
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for work in works:
            work.wait()


def rendezvous_address() -> str:
    """This host's IPv4 address on HOROVOD_GLOO_IFACE (the interface horovodrun gives Gloo, which
    reaches the other hosts), or 127.0.0.1 when that variable is not set."""
    iface = os.environ.get("HOROVOD_GLOO_IFACE")
    if not iface:
        return "127.0.0.1"
    from horovod.runner.util.network import get_driver_ip
    return get_driver_ip([iface])


def init_torch_distributed(backend: str = "gloo", **kwargs) -> None:
    """Joins a torch.distributed group (`backend`, Gloo by default) at rank 0's rendezvous_address()
    and a port rank 0 picks, both shared through Horovod; Gloo's connections go over
    HOROVOD_GLOO_IFACE too unless GLOO_SOCKET_IFNAME is set. `kwargs` go to init_process_group."""
    if os.environ.get("HOROVOD_GLOO_IFACE"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", os.environ["HOROVOD_GLOO_IFACE"])
    where = torch.zeros(2, dtype=torch.int64)  # rank 0's IPv4 address as an integer, and the port
    if hvd.rank() == 0:
        address = rendezvous_address()
        with socket.socket() as s:
            s.bind((address, 0))
            where[0], where[1] = int(ipaddress.IPv4Address(address)), s.getsockname()[1]
    hvd.broadcast_(where, root_rank=0, name="bench.rendezvous")
    host, port = ipaddress.IPv4Address(int(where[0])), int(where[1])
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=hvd.rank(), world_size=hvd.size(),
                            **kwargs)


def job() -> report.Job:
    """The job's helpers over torch.distributed (which must be initialised), usable while Horovod
    is not."""
    size = dist.get_world_size()

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def count_wrong(tensors: list[torch.Tensor]) -> int:
        expected = size * (size + 1) / 2
        wrong = torch.tensor([sum(int((t != expected).sum()) for t in tensors)])
        dist.all_reduce(wrong)
        return int(wrong.item())

    return report.Job(dist.get_rank(), size, dist.barrier, slowest, count_wrong)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    report.add_arguments(parser)
    args = parser.parse_args()

    hvd.init()
    machine = report.machine(hvd.size())  # before the measurements load the machine
    init_torch_distributed()
    libs = [Horovod(), TorchGloo()]
    root = hvd.rank() == 0
    sweep, many_small = report.measure(libs, job(), args)
    if root:
        results = {"machine": machine, "allreduce": sweep,
                   "many_small": many_small}
        if args.json:
            report.write_json(args.json, results)
        if args.markdown:
            report.write_markdown(args.markdown, results)

    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
