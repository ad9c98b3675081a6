"""Elastic training with hvd.DistributedOptimizer(compression=hvd.PowerSGD(...)), for
test_stateful_compression.py's reset from 4 ranks to 2.

Float64 regression on a fixed global batch per step split over the ranks, SGD, a commit after
every step. Before each step every rank prints ``STEP {json}`` with the compressor's state as it
is about to be used: its step, a checksum of its factors and how many residuals it holds, and a
checksum of the parameters; ``FINAL {json}`` at the end.

argv: total steps; env STEP_SLEEP (seconds per step).
"""

import json
import os
import sys
import time

import torch

import horovod.torch as hvd

GLOBAL_BATCH = 8


def log(kind, **fields):
    fields.update(rank=hvd.rank(), size=hvd.size(), pid=os.getpid())
    print(kind + " " + json.dumps(fields), flush=True)


def checksum(tensors):
    return float(sum(float((t.double() * (i + 1)).sum()) for i, t in enumerate(tensors)))


def main():
    steps = int(sys.argv[1])
    step_sleep = float(os.environ.get("STEP_SLEEP", "0.1"))
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6)).double()
    compressor = hvd.PowerSGD(rank=2, start_iter=2, min_compression_rate=1.0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters(), compression=compressor)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, steps=0)

    @hvd.elastic.run
    def train(state):
        while state.steps < steps:
            log("STEP", steps=state.steps, compressor_step=compressor.step,
                q=checksum([compressor.q[k] for k in sorted(compressor.q)]), residuals=len(compressor.residuals),
                params=checksum(model.parameters()))
            generator = torch.Generator().manual_seed(state.steps)
            x = torch.randn(GLOBAL_BATCH, 6, generator=generator, dtype=torch.float64)
            y = torch.randn(GLOBAL_BATCH, 6, generator=generator, dtype=torch.float64)
            rows = slice(hvd.rank(), GLOBAL_BATCH, hvd.size())
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
            optimizer.step()
            state.steps += 1
            time.sleep(step_sleep)
            state.commit()

    train(state)
    log("FINAL", params=[p.detach().reshape(-1).tolist() for p in model.parameters()], steps=state.steps)


if __name__ == "__main__":
    main()
