"""Data-parallel training of a small CNN on scikit-learn's digits with horovod.torch.

The digits data set (1,797 8x8 grey-scale images of handwritten digits) ships with scikit-learn,
so nothing is downloaded. Run on two processes with

    horovodrun -np 2 -H localhost:2 python pytorch_digits.py

or on one with ``python pytorch_digits.py``. Every rank trains on its own shard of the training
set; gradients are averaged by ``hvd.DistributedOptimizer``. After training, the script checks
that every rank holds bitwise-identical parameters and buffers (exit status 1 if not), and rank
0 writes a checkpoint and ends by printing the test accuracy.

Options that exercise more of horovod.torch:

* ``--backward-passes-per-step N``: each batch is split into N micro-batches whose gradients
  accumulate locally; the optimizer allreduces once per batch.
* ``--fp16-allreduce``: gradients travel as float16 (``hvd.Compression.fp16``).
* ``--use-adasum``: combine the ranks' updates with Adasum (``op=hvd.Adasum``) instead of
  averaging gradients; the learning rate is then not scaled by the number of ranks. Exits with
  status 2 and the reason if this build of Horovod cannot do Adasum.
* ``--sync-bn``: adds batch normalisation after each convolution, with statistics computed over
  all ranks' batches (``hvd.SyncBatchNorm``).
"""

import argparse
import os
import sys
import tempfile

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=10, help='passes over the training set')
    parser.add_argument('--batch-size', type=int, default=32, help='examples per step per rank')
    parser.add_argument('--lr', type=float, default=0.05,
                        help='learning rate for one process; scaled by the number of ranks')
    parser.add_argument('--seed', type=int, default=42, help='seed for the split and the model')
    parser.add_argument('--backward-passes-per-step', type=int, default=1,
                        help='micro-batches per batch, accumulated before each allreduce')
    parser.add_argument('--fp16-allreduce', action='store_true',
                        help='compress gradients to float16 for the allreduce')
    parser.add_argument('--use-adasum', action='store_true',
                        help='combine updates with Adasum instead of averaging gradients')
    parser.add_argument('--sync-bn', action='store_true',
                        help='add batch normalisation synchronised across ranks')
    parser.add_argument('--no-cuda', action='store_true',
                        help='train on the CPU even when a GPU and a Horovod build with NCCL are there')
    parser.add_argument('--checkpoint', default=os.path.join(tempfile.gettempdir(),
                                                             'pytorch_digits.pt'),
                        help='where rank 0 writes the trained model')
    args = parser.parse_args()
    if args.backward_passes_per_step < 1:
        parser.error('--backward-passes-per-step must be at least 1')
    return args


class Net(torch.nn.Module):
    def __init__(self, batch_norm=False):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(16) if batch_norm else torch.nn.Identity()
        self.bn2 = torch.nn.BatchNorm2d(32) if batch_norm else torch.nn.Identity()
        self.fc1 = torch.nn.Linear(32 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def load_data(seed):
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, random_state=seed, stratify=labels)
    return x_train, x_test, y_train, y_test


def metric_average(value, name):
    """Averages a Python float over all ranks."""
    return hvd.allreduce(torch.tensor(value, dtype=torch.float64), name=name).item()


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(1) == y).double().mean().item()
    return loss, accuracy


def check_identical_parameters(model):
    """Returns True when every rank holds bitwise the same parameters and floating-point
    buffers (batch norm running statistics) as rank 0."""
    flat = torch.cat([t.detach().reshape(-1).double() for t in model.state_dict().values()
                      if t.is_floating_point()])
    reference = hvd.broadcast(flat, root_rank=0, name='final_parameters')
    same = torch.tensor([int(torch.equal(flat, reference))], dtype=torch.int32)
    return bool(hvd.allreduce(same, op=hvd.Min, name='parameters_identical').item())


def check_adasum():
    """Exits with status 2 and the reason when this Horovod build cannot reduce with Adasum."""
    try:
        hvd.allreduce(torch.ones(4), op=hvd.Adasum, name='adasum_probe')
    except (NotImplementedError, hvd.HorovodInternalError) as error:
        print(f'rank {hvd.rank()}: --use-adasum is not available: {error}', file=sys.stderr)
        sys.exit(2)


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    # One GPU per process, the local rank's, when there is one and Horovod was built with NCCL;
    # otherwise (and with --no-cuda) everything stays on the CPU.
    device = torch.device('cpu')
    if not args.no_cuda and torch.cuda.is_available() and hvd.cuda_built():
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device('cuda', hvd.local_rank())

    x_train, x_test, y_train, y_test = (t.to(device) for t in load_data(args.seed))
    # Each rank trains on every size-th example, starting at its rank.
    x_shard, y_shard = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

    model = Net(batch_norm=args.sync_bn)
    if args.sync_bn:
        model = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    if args.use_adasum:
        check_adasum()
    # Averaged gradients over size() ranks act like a size() times larger batch, hence the
    # larger learning rate; Adasum combines the ranks' updates without that scaling.
    lr = args.lr if args.use_adasum else args.lr * hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        backward_passes_per_step=args.backward_passes_per_step,
        op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Every rank must take the same number of steps; shards may differ by one example, so the
    # step count comes from the shortest shard.
    steps = -(-(len(x_train) // hvd.size()) // args.batch_size)
    generator = torch.Generator().manual_seed(args.seed + hvd.rank())
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x_shard), generator=generator).to(device)
        for step in range(steps):
            index = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            # Every rank runs the same number of micro-batches (some may be empty), so that
            # SyncBatchNorm's collectives line up; each adds its share of the batch's mean loss.
            for part in index.tensor_split(args.backward_passes_per_step):
                loss = F.cross_entropy(model(x_shard[part]), y_shard[part], reduction='sum')
                (loss / len(index)).backward()
            optimizer.step()
        train_loss, train_accuracy = evaluate(model, x_shard, y_shard)
        train_loss = metric_average(train_loss, 'train_loss')
        train_accuracy = metric_average(train_accuracy, 'train_accuracy')
        if hvd.rank() == 0:
            print(f'epoch {epoch:2d}: train loss {train_loss:.4f}, '
                  f'train accuracy {train_accuracy:.4f}', flush=True)

    if not check_identical_parameters(model):
        print(f'rank {hvd.rank()}: parameters differ between ranks after training',
              file=sys.stderr)
        sys.exit(1)

    test_loss, test_accuracy = evaluate(model, x_test, y_test)
    if hvd.rank() == 0:
        torch.save(model.state_dict(), args.checkpoint)
        print(f'checkpoint written to {args.checkpoint}')
        print(f'parameters identical on all {hvd.size()} ranks')
        print(f'test loss: {test_loss:.4f}')
        print(f'test accuracy: {test_accuracy:.4f}', flush=True)


if __name__ == '__main__':
    main()
