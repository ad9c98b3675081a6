"""Elastic training with hvd.ZeroRedundancyOptimizer, for test_zero.py's reset from 4 ranks to 2.

Float64 regression, AdamW, a commit after every step. Step ``s`` trains on a fixed global batch
of 8 samples, split evenly over the ranks, so the averaged gradient, and the whole trajectory,
do not depend on the world size: the final parameters must equal a single-process AdamW replay
whatever the resets did, provided no optimizer state was lost. Prints ``STEP {json}`` per step
and ``FINAL {json}`` (parameters, the state entries this rank holds) at the end.

argv: total steps; env STEP_SLEEP (seconds per step).
"""

import json
import os
import sys
import time

import torch

import horovod.torch as hvd

GLOBAL_BATCH = 8


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(4)]).double()


def global_batch(step):
    generator = torch.Generator().manual_seed(step)
    return (torch.randn(GLOBAL_BATCH, 6, generator=generator, dtype=torch.float64),
            torch.randn(GLOBAL_BATCH, 6, generator=generator, dtype=torch.float64))


def log(kind, **fields):
    fields.update(rank=hvd.rank(), size=hvd.size(), pid=os.getpid())
    print(kind + " " + json.dumps(fields), flush=True)


def main():
    steps = int(sys.argv[1])
    step_sleep = float(os.environ.get("STEP_SLEEP", "0.1"))
    hvd.init()
    torch.set_num_threads(1)
    model = make_model()
    optimizer = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=0.01)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, steps=0)

    @hvd.elastic.run
    def train(state):
        while state.steps < steps:
            x, y = global_batch(state.steps)
            rows = slice(hvd.rank(), GLOBAL_BATCH, hvd.size())
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
            optimizer.step()
            state.steps += 1
            log("STEP", steps=state.steps, held=len(optimizer.state))
            time.sleep(step_sleep)
            state.commit()

    train(state)
    log("FINAL", params=[p.detach().reshape(-1).tolist() for p in model.parameters()],
        held=len(optimizer.state), steps=state.steps)


if __name__ == "__main__":
    main()
