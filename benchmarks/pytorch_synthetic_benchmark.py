"""Training throughput of a CNN on synthetic data: Horovod's DistributedOptimizer next to
torch DistributedDataParallel (Gloo), in the same processes.

Run one process per rank under the launcher:

    horovodrun -np 2 -H localhost:2 python benchmarks/pytorch_synthetic_benchmark.py \
        --json benchmarks/results/pytorch-synthetic-np2.json

Every rank trains the same CNN (defined below; no torchvision) on one fixed random batch of
--batch-size RGB images of --image-size pixels square with SGD, one intra-op thread per process.
--model picks the CNN: smallcnn (default, 32x32 images), or resnet18 / resnet50 (He et al., "Deep
Residual Learning for Image Recognition", 2015: the ImageNet layout, basic blocks for 18 layers,
bottleneck blocks for 50; with 10 classes 11.2 M and 23.5 M parameters in 62 and 161 tensors) on smaller images
than ImageNet's 224 so that a 2-core machine gets through a run. A timed iteration is
--batches-per-iter optimizer steps; img/sec per rank = batch size * batches per iter / seconds.
Horovod and DDP (and, with --local-reference, 'local': the same training without any gradient
exchange, the ranks waiting for each other once per step, the most that any synchronous
data-parallel library can reach on the machine) alternate in --rounds rounds of --iters timed
iterations (each preceded by --warmup untimed ones), so that all see the same machine load; the
figures are the mean and 1.96 standard deviations over all of a framework's timed iterations.
Total img/sec = per-rank mean * size. DDP's process group is initialised over TCP on 127.0.0.1, at a free port that
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


class Block(torch.nn.Module):
    """A residual block: two 3x3 convolutions (basic) or 1x1, 3x3, 1x1 (bottleneck, 4x wider out),
    batch-normalised, plus the input (projected by a strided 1x1 convolution when shapes differ)."""

    def __init__(self, in_channels, channels, stride, bottleneck):
        super().__init__()
        out = channels * (4 if bottleneck else 1)
        if bottleneck:
            shapes = [(in_channels, channels, 1, 1), (channels, channels, 3, stride), (channels, out, 1, 1)]
        else:
            shapes = [(in_channels, channels, 3, stride), (channels, channels, 3, 1)]
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv2d(i, o, k, stride=st, padding=k // 2, bias=False) for i, o, k, st in shapes)
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm2d(o) for _, o, _, _ in shapes)
        self.shortcut = None
        if stride != 1 or in_channels != out:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(in_channels, out, 1, stride=stride, bias=False),
                                                torch.nn.BatchNorm2d(out))

    def forward(self, x):
        y = x
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms, strict=True)):
            y = norm(conv(y))
            if i < len(self.convs) - 1:
                y = F.relu(y)
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(torch.nn.Module):
    """ResNet-18 (``blocks=(2, 2, 2, 2)``, basic) or ResNet-50 (``(3, 4, 6, 3)``, bottleneck)."""

    def __init__(self, blocks, bottleneck, num_classes=10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                                        torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
                                        torch.nn.MaxPool2d(3, stride=2, padding=1))
        layers, in_channels = [], 64
        for stage, count in enumerate(blocks):
            channels = 64 * 2 ** stage
            for b in range(count):
                layers.append(Block(in_channels, channels, 2 if b == 0 and stage > 0 else 1, bottleneck))
                in_channels = channels * (4 if bottleneck else 1)
        self.layers = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(in_channels, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS = {
    'smallcnn': SmallCNN,
    'resnet18': lambda: ResNet((2, 2, 2, 2), bottleneck=False),
    'resnet50': lambda: ResNet((3, 4, 6, 3), bottleneck=True),
}
MODEL_NAMES = {'smallcnn': 'SmallCNN', 'resnet18': 'ResNet-18', 'resnet50': 'ResNet-50'}


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def make_local(args):
    """The model and its plain SGD optimizer, the same on every rank (seeded)."""
    torch.manual_seed(0)
    model = MODELS[args.model]()
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def make_horovod(args):
    model, optimizer = make_local(args)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return model, optimizer


def make_ddp(args):
    model, optimizer = make_local(args)
    return torch.nn.parallel.DistributedDataParallel(model), optimizer


def time_iterations(model, optimizer, data, target, args, count, after_step=None):
    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
        if after_step is not None:
            after_step()

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
    parser.add_argument('--model', choices=sorted(MODELS), default='smallcnn')
    parser.add_argument('--image-size', type=int, default=32, help='pixels per side (default 32)')
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--batches-per-iter', type=int, default=10)
    parser.add_argument('--warmup', type=int, default=2, help='untimed iterations per round')
    parser.add_argument('--iters', type=int, default=5, help='timed iterations per round')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--no-ddp', action='store_true', help='measure Horovod only')
    parser.add_argument('--local-reference', action='store_true',
                        help="also measure 'local': the same training with no gradient exchange, "
                             'the ranks only waiting for each other once per step (the ceiling of '
                             'any synchronous data-parallel library on this machine)')
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
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 10, (args.batch_size,))

    frameworks = {'horovod': make_horovod(args)}
    if not args.no_ddp:
        frameworks['ddp'] = make_ddp(args)
    if args.local_reference:
        frameworks['local'] = make_local(args)
    rates = {name: [] for name in frameworks}
    for _ in range(args.rounds):
        for name, (model, optimizer) in frameworks.items():
            # 'local' trains on each rank's own gradients and only meets the other ranks once per
            # step: what synchronous data-parallel training reaches with free communication.
            after_step = hvd.barrier if name == 'local' else None
            time_iterations(model, optimizer, data, target, args, args.warmup, after_step)
            rates[name] += time_iterations(model, optimizer, data, target, args, args.iters, after_step)

    results = {name: summary(r, size) for name, r in rates.items()}
    if rank == 0:
        n_params = sum(p.numel() for p in frameworks['horovod'][0].parameters())
        print(f'Model: {MODEL_NAMES[args.model]} ({n_params} parameters), batch size {args.batch_size}, '
              f'{args.image_size}x{args.image_size} images, '
              f'{size} rank(s), 1 thread each, {os.cpu_count()} CPUs, Horovod controller '
              f'{os.environ.get("HOROVOD_CONTROLLER", "gloo")}, load {os.getloadavg()[0]:.2f}')
        print(f'{"framework":<10} {"img/sec per rank":>22} {"total img/sec":>14}')
        for name, r in results.items():
            print(f'{name:<10} {r["img_sec_per_rank"]:>12.1f} +-{r["img_sec_per_rank_ci95"]:>7.1f}'
                  f' {r["img_sec_total"]:>14.1f}')
        if args.json:
            record = {'benchmark': 'pytorch_synthetic', 'model': MODEL_NAMES[args.model],
                      'image_size': args.image_size,
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
