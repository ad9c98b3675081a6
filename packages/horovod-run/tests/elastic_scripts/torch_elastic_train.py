"""An elastic PyTorch training script for the launcher's tests.

Linear regression in float64 on 96 fixed samples, 4 samples per rank and step, SGD on the mean
loss of the global batch, a commit after every step. Every step is logged as
``STEP {json}`` (rank, size, epoch, committed batch count, pid); the committed state also holds
``seen``, the sample indices of every committed global batch, so that the test can replay the
training in one process. At the end each rank prints ``FINAL {json}`` with its parameters (and
the HOROVOD_ELASTIC_TIMEOUT it was given).

argv: epochs; env STEP_SLEEP (seconds per step, default 0.1),
EXIT_ALL_AT (every rank exits 1 at that step: the "all workers fail" case),
START_DELAY (``host:seconds``: a worker on that host sleeps before ``hvd.init()``, a slow start)
and START_FAIL (``host``: a worker on that host exits 3 before ``hvd.init()``).
"""

import json
import os
import socket
import sys
import time

import torch

import horovod.torch as hvd

EPOCHS = int(sys.argv[1])
BATCH = 4
N = 96
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0.1"))
EXIT_ALL_AT = int(os.environ.get("EXIT_ALL_AT", "-1"))

delay_host, _, delay_s = os.environ.get("START_DELAY", "").partition(":")
if delay_host == socket.gethostname():
    time.sleep(float(delay_s))
if os.environ.get("START_FAIL") == socket.gethostname():
    print("START_FAIL: exiting before hvd.init()", flush=True)
    sys.exit(3)

hvd.init()
torch.set_num_threads(1)
generator = torch.Generator().manual_seed(1)
X = torch.randn(N, 3, generator=generator, dtype=torch.float64)
y = X @ torch.tensor([1.5, -2.0, 0.5], dtype=torch.float64) + 0.1

model = torch.nn.Linear(3, 1).double()
with torch.no_grad():
    model.weight.zero_()
    model.bias.zero_()
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                     named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(range(N), shuffle=True, seed=3)
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0,
                               steps=0, seen=[])


def log(kind, **fields):
    fields.update(rank=hvd.rank(), size=hvd.size(), pid=os.getpid(), host=socket.gethostname(),
                  time=time.time())
    print(kind + " " + json.dumps(fields), flush=True)


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        indices = list(state.sampler)
        for start in range(0, len(indices), BATCH):
            batch = indices[start:start + BATCH]
            optimizer.zero_grad()
            loss = ((model(X[batch]).squeeze(1) - y[batch]) ** 2).mean()
            loss.backward()
            optimizer.step()
            everyone = hvd.allgather_object(batch, name="batch")
            state.seen = state.seen + [[state.epoch, sorted(i for b in everyone for i in b)]]
            state.sampler.record_batch(start // BATCH, len(batch))
            state.steps += 1
            if state.steps == EXIT_ALL_AT:
                sys.exit(1)
            log("STEP", epoch=state.epoch, steps=state.steps)
            time.sleep(STEP_SLEEP)
            state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()


train(state)
params = [p.detach().reshape(-1).tolist() for p in model.parameters()]
log("FINAL", params=params, seen=state.seen if hvd.rank() == 0 else None, steps=state.steps,
    elastic_timeout=os.environ.get("HOROVOD_ELASTIC_TIMEOUT"))
hvd.shutdown()
