"""Resets an elastic job N times in a row (every rank raises HorovodInternalError at the same
step) and reports the process's open file descriptors, threads, mapped shared-memory segments
and /dev/shm names (its own, ``horovod.<pid>.*``) after reset 5 and after the last, as
``LEAKS {json}``. Each figure is the most frequent of five samples (resets 5-9, and the last
five): whether the shared-memory segment is mapped yet when the sample is taken varies from reset
to reset (one descriptor and one mapping more or less), which is not a leak, while anything that
leaks per reset shows in every sample of the last five."""

import collections
import json
import os
import sys

import numpy as np

import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError

RESETS = int(sys.argv[1])
hvd.init()
state = hvd.elastic.TorchState(steps=0)
resets = 0
windows = {}  # 5 (resets 5-9) or RESETS (the last five) -> the samples taken at those resets
samples = {}


def measure():
    with open("/proc/self/maps") as f:
        shm_maps = sum(1 for line in f if "/dev/shm/" in line)
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "shm_maps": shm_maps,
            "shm": len([n for n in os.listdir("/dev/shm") if n.startswith("horovod.%d." % os.getpid())])}


@hvd.elastic.run
def train(state):
    global resets
    while state.steps < 3:
        x = hvd.allreduce(__import__("torch").ones(1000), name="x")
        assert float(x[0]) == 1.0
        if resets < RESETS:
            resets += 1
            window = 5 if 5 <= resets < 10 else RESETS if resets > RESETS - 5 else None
            if window is not None:
                windows.setdefault(window, []).append(measure())
            raise HorovodInternalError("reset %d asked for by the test" % resets)
        state.steps += 1
        state.commit()


train(state)
for window, measured in windows.items():
    samples[window] = {key: collections.Counter(m[key] for m in measured).most_common(1)[0][0]
                       for key in measured[0]}
print("LEAKS " + json.dumps({"rank": hvd.rank(), "samples": {str(k): v for k, v in samples.items()},
                             "final": measure(), "size": hvd.size(), "x": np.zeros(1).tolist()}),
      flush=True)
hvd.shutdown()
