"""Training throughput of a small CNN on synthetic data: Horovod's DistributedOptimizer next to
torch DistributedDataParallel (Gloo), in the same processes.

Run one process per rank under the launcher:

    horovodrun -np 2 -H localhost:2 python benchmarks/pytorch_synthetic_benchmark.py \
        --json benchmarks/results/pytorch-synthetic-np2.json

Every rank trains the same CNN (defined below; no torchvision) on one fixed random batch of
--batch-size 32x32 RGB images with SGD, one intra-op thread per process. A timed iteration is
--batches-per-iter optimizer steps; img/sec per rank = batch size * batches per iter / seconds.
Horovod and DDP alternate in --rounds rounds of --iters timed iterations (each preceded by
--warmup untimed ones), so that both see the same machine load; the figures are the mean and
1.96 standard deviations over all of a framework's timed iterations. Total img/sec = per-rank
mean * size. DDP's process group is initialised over TCP on 127.0.0.1, at a free port that
rank 0 picks and broadcasts with Horovod. Rank 0 prints a table and, with --json, writes it.
"""

import argparse
import json
import os
import platform
import socket
import statistics
import timeit

import torch
import torch.distributed as dist
import torch.nn.functional as F

import horovod.torch as hvd


class SmallCNN(torch.nn.Module):
    """Three conv layers and two linear ones: about 0.19 M parameters in 10 tensors."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(64, 64, 3, padding=1)
        self.fc1 = torch.nn.Linear(64 * 4 * 4, 128)
        self.fc2 = torch.nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def make_horovod(args):
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return model, optimizer


def make_ddp(args):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(SmallCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, optimizer


def time_iterations(model, optimizer, data, target, args, count):
    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    rates = []
    for _ in range(count):
        seconds = timeit.timeit(benchmark_step, number=args.batches_per_iter)
        rates.append(args.batch_size * args.batches_per_iter / seconds)
    return rates


def summary(rates, size):
    mean = statistics.fmean(rates)
    spread = 1.96 * statistics.stdev(rates) if len(rates) > 1 else 0.0
    return {'img_sec_per_rank': round(mean, 1), 'img_sec_per_rank_ci95': round(spread, 1),
            'img_sec_total': round(mean * size, 1), 'iterations': len(rates)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--batches-per-iter', type=int, default=10)
    parser.add_argument('--warmup', type=int, default=2, help='untimed iterations per round')
    parser.add_argument('--iters', type=int, default=5, help='timed iterations per round')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--no-ddp', action='store_true', help='measure Horovod only')
    parser.add_argument('--json', help='rank 0 writes the results here')
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    size, rank = hvd.size(), hvd.rank()

    if not args.no_ddp:
        port = hvd.broadcast_object(free_port() if rank == 0 else None, root_rank=0,
                                    name='ddp_port')
        dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                                world_size=size)

    torch.manual_seed(1234 + rank)
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    frameworks = {'horovod': make_horovod(args)}
    if not args.no_ddp:
        frameworks['ddp'] = make_ddp(args)
    rates = {name: [] for name in frameworks}
    for _ in range(args.rounds):
        for name, (model, optimizer) in frameworks.items():
            time_iterations(model, optimizer, data, target, args, args.warmup)
            rates[name] += time_iterations(model, optimizer, data, target, args, args.iters)

    results = {name: summary(r, size) for name, r in rates.items()}
    if rank == 0:
        n_params = sum(p.numel() for p in frameworks['horovod'][0].parameters())
        print(f'Model: SmallCNN ({n_params} parameters), batch size {args.batch_size}, '
              f'{size} rank(s), 1 thread each, {os.cpu_count()} CPUs, Horovod controller '
              f'{os.environ.get("HOROVOD_CONTROLLER", "gloo")}, load {os.getloadavg()[0]:.2f}')
        print(f'{"framework":<10} {"img/sec per rank":>22} {"total img/sec":>14}')
        for name, r in results.items():
            print(f'{name:<10} {r["img_sec_per_rank"]:>12.1f} +-{r["img_sec_per_rank_ci95"]:>7.1f}'
                  f' {r["img_sec_total"]:>14.1f}')
        if args.json:
            record = {'benchmark': 'pytorch_synthetic', 'model': 'SmallCNN',
                      'parameters': n_params, 'size': size, 'batch_size': args.batch_size,
                      'batches_per_iter': args.batches_per_iter, 'warmup': args.warmup,
                      'iters': args.iters, 'rounds': args.rounds, 'cpus': os.cpu_count(),
                      'torch': torch.__version__, 'python': platform.python_version(),
                      'controller': os.environ.get('HOROVOD_CONTROLLER', 'gloo'),
                      'load_average': os.getloadavg(), 'results': results}
            with open(args.json, 'w') as f:
                json.dump(record, f, indent=2)
                f.write('\n')
    if not args.no_ddp:
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == '__main__':
    main()
