"""Compression measured on the wire (issue 43): two hosts of the test bed, one rank each, so that
every byte the ranks exchange crosses the link; each rank reads its host's interface counters
(/proc/net/dev of the host's network namespace: bytes and packets sent) around its steps."""

import json
import re
import subprocess
import sys
import textwrap

N, M, R, STEPS = 512, 384, 4, 5

WORKER = textwrap.dedent("""
    import json
    import torch
    import horovod.torch as hvd
    from horovod.common import _core

    N, M, R, STEPS = {n}, {m}, {r}, {steps}

    def sent():
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, counters = line.partition(":")
                if name.strip() == "hvdbr0":
                    # bytes and packets sent, and the engine's negotiation cycles so far
                    return [int(v) for v in counters.split()[8:10]] + [_core.engine_stats()["cycles"]]
        raise RuntimeError("no hvdbr0")

    def measure(body):
        hvd.barrier()
        before = sent()
        for step in range(STEPS):
            body(step)
        hvd.barrier()
        return [after - b for after, b in zip(sent(), before)]

    hvd.init()
    generator = torch.Generator().manual_seed(hvd.rank())
    # Full rank: a random matrix, different on each rank.
    grad = torch.randn(N, M, generator=generator)
    tiny = torch.ones(1)
    compressor = hvd.PowerSGD(rank=R, start_iter=0, min_compression_rate=1.0)
    result = {{
        "barriers": measure(lambda step: None),
        "tiny": measure(lambda step: hvd.allreduce(tiny, name="tiny.%d" % step)),
        "plain": measure(lambda step: hvd.allreduce(grad, name="plain.%d" % step)),
        "powersgd": measure(lambda step: compressor.reduce([("w", grad)])),
        "compressed": compressor.compressed(grad.shape),
    }}
    print("RESULT " + json.dumps(result), flush=True)
""")


# Bytes of the Ethernet, IPv4 and TCP headers (with the timestamp option) of every packet the
# counters count; what is left of a packet is what TCP carried for the ranks.
HEADER_BYTES = 14 + 20 + 32


def payload(measured, baseline):
    """TCP payload bytes of a measurement, [bytes, packets, cycles], less the baseline's (the
    barriers around it)."""
    return (measured[0] - measured[1] * HEADER_BYTES) - (baseline[0] - baseline[1] * HEADER_BYTES)


def cycles(measured, baseline):
    return measured[2] - baseline[2]


def test_powersgd_sends_n_plus_m_times_r_values(testbed, tmp_path):
    """PowerSGD of rank R on a full-rank N x M float32 gradient sends at most (N + M) R / (N M) of
    the uncompressed allreduce's bytes, plus headers: each packet's, and the negotiation, at most
    the bytes per cycle of one-element allreduces (each a full negotiation of a new name) for each
    cycle that ran: a rank that submits P or Q before the other negotiates until the other does."""
    worker = tmp_path / "wire.py"
    worker.write_text(WORKER.format(n=N, m=M, r=R, steps=STEPS))
    hosts = ",".join(f"{address}:1" for _, address in testbed.hosts[:2])
    run = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "2", "-H", hosts,
                          sys.executable, str(worker)], capture_output=True, text=True, timeout=180,
                         env=testbed.env())
    assert run.returncode == 0, run.stdout + run.stderr
    results = [json.loads(m.group(1)) for m in re.finditer(r"<stdout>:RESULT (.*)$", run.stdout, re.MULTILINE)]
    assert len(results) == 2, run.stdout
    bound = (N + M) * R / (N * M)
    for r in results:
        assert r["compressed"], r
        plain = payload(r["plain"], r["barriers"])
        powersgd = payload(r["powersgd"], r["barriers"])
        per_cycle = payload(r["tiny"], r["barriers"]) / cycles(r["tiny"], r["barriers"])
        negotiation = per_cycle * cycles(r["powersgd"], r["barriers"])
        # The uncompressed allreduce sends each of the N M values once (two ranks: a ring's
        # reduce-scatter and allgather halves each send half of them).
        assert plain >= STEPS * N * M * 4, r
        assert powersgd <= bound * plain + negotiation, (r, powersgd / plain, bound)
        print(f"payload ratio {powersgd / plain:.5f}, bound {bound:.5f} + negotiation {negotiation / plain:.5f}; "
              f"with headers {(r['powersgd'][0] - r['barriers'][0]) / (r['plain'][0] - r['barriers'][0]):.5f}")
