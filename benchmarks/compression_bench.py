"""Gradient compression across hosts: bytes on the wire, step time and accuracy per compressor.

Run one process per rank on the test bed's hosts, the links shaped to 1 Gbit/s:

    ci/testbed.sh up 2 && ci/testbed.sh shape-rate 1gbit
    HOROVOD_GLOO_IFACE=hvdbr0 horovodrun --gloo -np 4 -H 198.18.0.1:2,198.18.0.2:2 \\
        --network-interfaces hvdbr0 python benchmarks/compression_bench.py \\
        --json benchmarks/results/compression-2x2.json --markdown benchmarks/results/compression-2x2.md

Every configuration (--configs: none, fp16, bf16, powersgd-r1, powersgd-r4, topk-1, comma-separated)
trains the same model from the same initial parameters on the same data in these processes, one
after the other: a small transformer encoder that reads each 8 x 8 image of scikit-learn's digits
as 16 tokens of 2 x 2 pixels and classifies it (about 3.2 million parameters with the defaults,
12.7 MB of float32 gradients a step), with Adam, --batch images per rank a step, for --epochs
epochs of the 1,437 training images (the other 360 are the test set).
``hvd.DistributedOptimizer`` takes the compressor (``hvd.Compression.none``, ``.fp16``, ``.bf16``,
``hvd.PowerSGD(rank=r, start_iter=10)``, ``hvd.TopK(ratio=0.01)``).

What is measured, per configuration:
- bytes on the wire per step: the interface counters of each host (``/proc/net/dev`` of the host's
  network namespace, bytes sent on --iface, read by the host's local rank 0 before the first and
  after the last step), summed over the hosts and divided by the steps. Everything the host sent
  is counted (the collectives, the negotiation and whatever else used the link), nothing computed;
  traffic between two ranks of one host goes through shared memory and never reaches the counter.
- step time: the median over the steps after the first --skip of the slowest rank's step
  (forward, backward, the optimizer's step with its collectives), in milliseconds;
- final accuracy: the share of the test images the trained model classifies right (every rank has
  the same parameters; rank 0 evaluates) and the final training loss (mean of the last epoch).

--json adds the run under --label (replacing a run of that label); --markdown writes every run of
the file. Timings describe this run's machine only: on the bed every host is the same machine, so
the ranks also compete for its cores.
"""

import argparse
import json
import os
import socket
import statistics
import time

import numpy as np
import torch
from sklearn.datasets import load_digits

import horovod.torch as hvd
import report

CONFIGS = ("none", "fp16", "bf16", "powersgd-r1", "powersgd-r4", "topk-1")


def compressor(config: str):
    if config == "none":
        return hvd.Compression.none
    if config == "fp16":
        return hvd.Compression.fp16
    if config == "bf16":
        return hvd.Compression.bf16
    if config.startswith("powersgd-r"):
        return hvd.PowerSGD(rank=int(config[len("powersgd-r"):]), start_iter=10)
    if config.startswith("topk-"):
        return hvd.TopK(ratio=float(config[len("topk-"):]) / 100)
    raise ValueError(f"unknown configuration {config!r}; expected one of {', '.join(CONFIGS)}")


class DigitsTransformer(torch.nn.Module):
    """Each 8 x 8 image as 16 tokens of 2 x 2 pixels, a transformer encoder (layer norm first: with
    it last, Adam at 1e-3 did not learn in 220 steps, measured), mean over the tokens,
    a linear classifier into the 10 digits."""

    def __init__(self, width: int, layers: int, heads: int):
        super().__init__()
        self.embed = torch.nn.Linear(4, width)
        self.position = torch.nn.Parameter(torch.zeros(16, width))
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, images):  # images: (batch, 64) float32 in [0, 1]
        patches = images.view(-1, 4, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(-1, 16, 4)
        return self.head(self.encoder(self.embed(patches) + self.position).mean(dim=1))


def load_data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]


def bytes_sent(iface: str) -> int:
    """Bytes sent on `iface` of this process's network namespace (/proc/net/dev)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == iface:
                return int(counters.split()[8])
    raise RuntimeError(f"no interface {iface} in /proc/net/dev on {socket.gethostname()}")


def train(config: str, data, args) -> dict:
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(args.seed)
    model = DigitsTransformer(args.width, args.layers, args.heads)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters(),
                                         compression=compressor(config))
    per_step = args.batch * hvd.size()
    steps_per_epoch = len(x_train) // per_step
    counting = hvd.local_rank() == 0
    hvd.barrier()
    sent_before = bytes_sent(args.iface) if counting else 0
    step_times, losses = [], []
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(args.seed + epoch))
        for step in range(steps_per_epoch):
            rows = order[step * per_step + hvd.rank() * args.batch:][:args.batch]
            start = time.perf_counter()
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[rows]), y_train[rows])
            loss.backward()
            optimizer.step()
            step_times.append(time.perf_counter() - start)
            if epoch == args.epochs - 1:
                losses.append(loss.item())
    hvd.barrier()
    sent = bytes_sent(args.iface) - sent_before if counting else 0
    steps = args.epochs * steps_per_epoch
    # The job is as slow as its slowest rank at every step.
    slowest = np.max(np.asarray(hvd.allgather_object(step_times)), axis=0)[args.skip:]
    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
    final_loss = float(hvd.allreduce(torch.tensor(statistics.fmean(losses)), op=hvd.Average))
    sent_by_host = dict(h for h in hvd.allgather_object((socket.gethostname(), sent) if counting else None) if h)
    return {"config": config, "steps": steps, "images_per_step": per_step,
            "bytes_per_step": sum(sent_by_host.values()) / steps, "bytes_by_host": sent_by_host,
            "step_ms": statistics.median(slowest) * 1e3, "accuracy": accuracy, "final_loss": final_loss,
            "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


def markdown(results: dict) -> list[str]:
    lines = ["# Gradient compression across hosts", "",
             "Written by benchmarks/compression_bench.py (its docstring: what is measured, the command).", ""]
    for label, run in results["runs"].items():
        m = run["machine"]
        lines += [f"## {label}", "", f"Command: `{run['command']}`", "",
                  "Hosts and their qdisc on the link: " + "; ".join(f"{h}: {q}" for h, q in run["shaping"].items()),
                  "", f"{m['cpu']}, {m['cores']} cores; {m['os']}; Python {m['python']}, torch {m['torch']}, "
                  f"horovod {m['horovod']}; {m['date']}; load average {m['load_average']}; {m['np']} ranks.", "",
                  "| compressor | bytes sent per step | ratio to none | step time (ms) | ratio to none "
                  "| test accuracy | final training loss |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        base = next((r for r in run["rows"] if r["config"] == "none"), None)
        for r in run["rows"]:
            sent = base["bytes_per_step"] if base else 0
            bytes_ratio = f"{r['bytes_per_step'] / sent:.3f}" if sent else ""
            time_ratio = f"{r['step_ms'] / base['step_ms']:.2f}" if base else ""
            lines.append(f"| {r['config']} | {r['bytes_per_step']:,.0f} | {bytes_ratio} | {r['step_ms']:.1f} "
                         f"| {time_ratio} | {r['accuracy']:.4f} | {r['final_loss']:.4f} |")
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--iface", default="hvdbr0", help="the interface whose counters are read")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8, help="images per rank per step")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", type=int, default=15, help="steps left out of the step time (warm-up)")
    parser.add_argument("--label", default="1 Gbit/s")
    parser.add_argument("--command", default="(not given)", help="the launch command, as the report shows it")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    configs = args.configs.split(",")
    for config in configs:
        compressor(config)  # a wrong name fails before any training
    torch.set_num_threads(1)
    hvd.init()
    data = load_data(args.seed)
    qdiscs = dict(q for q in hvd.allgather_object(
        (socket.gethostname(), report.shaping(args.iface)) if hvd.local_rank() == 0 else None) if q)
    rows = []
    for config in configs:
        rows.append(train(config, data, args))
        if hvd.rank() == 0:
            r = rows[-1]
            print(f"{config}: {r['bytes_per_step']:,.0f} B/step, {r['step_ms']:.1f} ms/step, "
                  f"accuracy {r['accuracy']:.4f}, loss {r['final_loss']:.4f}", flush=True)
    if hvd.rank() == 0 and args.json:
        results = {"runs": {}}
        if os.path.exists(args.json):
            with open(args.json) as f:
                results = json.load(f)
        results["runs"][args.label] = {"command": args.command, "shaping": qdiscs,
                                       "machine": report.machine(hvd.size()), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write("\n".join(markdown(results)) + "\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
