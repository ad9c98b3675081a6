"""How fast an elastic job reacts: from a host being listed to its workers training, and from a
worker's death (or its host leaving the list) to the survivors training again.

Runs on the multi-host test bed (ci/testbed.sh: network namespaces with their own sshd), as root:

    bash ci/testbed.sh up 2
    python benchmarks/elastic_bench.py --repeats 3 --json benchmarks/results/elastic.json \\
        --markdown benchmarks/results/elastic.md

Each repeat starts ``horovodrun -np 2 --min-np 2 --max-np 4 --host-discovery-script`` on host 1
(2 slots) with the elastic PyTorch training script of the launcher's tests
(packages/horovod-run/tests/elastic_scripts/torch_elastic_train.py, one step every
``--step-sleep`` seconds), then:

1. lists host 2 (2 slots) in the discovery file: **added** = time from the file's change to the
   first training step at size 4;
2. SIGKILLs a worker on host 2: **death** = time from the kill to the first step of the
   survivors at size 2;
3. (a new job) lists host 2, waits for size 4, then removes host 2 from the list: **removed** =
   time from the file's change to the first step at size 2.

The discovery interval is the default (``DISCOVER_HOSTS_FREQUENCY_SECS`` = 1 s). Times are wall
clock on this machine, taken from the STEP lines' timestamps (the same clock: every host is this
machine). They include the step sleep and the steps themselves, so they are upper bounds.
"""

import argparse
import json
import os
import pathlib
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN = ROOT / "packages" / "horovod-run" / "tests" / "elastic_scripts" / "torch_elastic_train.py"
sys.path.insert(0, str(ROOT / "packages" / "horovod-testing" / "src"))
from horovod_testing.testbed import Testbed  # noqa: E402


class Job:
    def __init__(self, workdir, hosts_file, env, step_sleep):
        self.steps = []
        self.hosts_file = hosts_file
        script = workdir / "discover.sh"
        script.write_text("#!/bin/sh\ncat %s\n" % hosts_file)
        script.chmod(0o755)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "horovod.runner.launch", "--network-interface", "hvdbr0",
             "-np", "2", "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
             sys.executable, str(TRAIN), "1000"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(env, STEP_SLEEP=str(step_sleep)))
        self.output = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.output.append(line)
            match = re.match(r"\[\d+\]<stdout>:STEP (.*)$", line)
            if match:
                self.steps.append(json.loads(match.group(1)))

    def first_step(self, size, after, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for step in list(self.steps):
                if step["size"] == size and step["time"] >= after:
                    return step
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("no step at size %d after %.1f:\n%s"
                           % (size, after, "".join(self.output[-40:])))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def set_hosts(path, hosts):
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(h + "\n" for h in hosts))
    os.replace(tmp, path)
    return time.time()


def one_repeat(bed, workdir, step_sleep):
    h1, h2 = bed.hosts[0], bed.hosts[1]
    env = bed.env()
    hosts_file = workdir / "hosts.txt"
    result = {}

    set_hosts(hosts_file, ["%s:2" % h1[1]])
    job = Job(workdir, hosts_file, env, step_sleep)
    try:
        job.first_step(2, 0)
        listed = set_hosts(hosts_file, ["%s:2" % h1[1], "%s:2" % h2[1]])
        step = job.first_step(4, listed)
        result["added"] = step["time"] - listed
        victim = next(s for s in job.steps if s["size"] == 4 and s["host"] == h2[0])
        time.sleep(1.0)
        killed = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        step = job.first_step(2, killed)
        result["death"] = step["time"] - killed
    finally:
        job.stop()

    set_hosts(hosts_file, ["%s:2" % h1[1], "%s:2" % h2[1]])
    job = Job(workdir, hosts_file, env, step_sleep)
    try:
        job.first_step(4, 0)
        time.sleep(1.0)
        removed = set_hosts(hosts_file, ["%s:2" % h1[1]])
        step = job.first_step(2, removed)
        result["removed"] = step["time"] - removed
    finally:
        job.stop()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-sleep", type=float, default=0.05,
                        help="seconds each training step sleeps (default 0.05)")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    bed = Testbed()
    if len(bed.hosts) < 2:
        sys.exit("the test bed is not up with 2 hosts: run 'bash ci/testbed.sh up 2' first")
    runs = []
    os.makedirs(ROOT / "build", exist_ok=True)
    with tempfile.TemporaryDirectory(dir=str(ROOT / "build")) as tmp:
        for repeat in range(args.repeats):
            result = one_repeat(bed, pathlib.Path(tmp), args.step_sleep)
            print("repeat %d: %s" % (repeat + 1, ", ".join("%s %.2f s" % kv
                                                           for kv in result.items())), flush=True)
            runs.append(result)
    summary = {key: {"median_s": statistics.median(r[key] for r in runs),
                     "max_s": max(r[key] for r in runs)} for key in runs[0]}
    machine = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
               "kernel": platform.release()}
    report = {"machine": machine, "step_sleep_s": args.step_sleep, "repeats": runs,
              "summary": summary}
    print(json.dumps(summary, indent=1))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        rows = ["| event | median (s) | worst (s) | goal |", "|---|---:|---:|---|"]
        names = {"added": "host listed -> its workers training (2 -> 4 ranks)",
                 "death": "worker SIGKILLed -> survivors training (4 -> 2 ranks)",
                 "removed": "host unlisted -> survivors training (4 -> 2 ranks)"}
        for key, value in summary.items():
            rows.append("| %s | %.2f | %.2f | < 5 s: %s |" % (
                names[key], value["median_s"], value["max_s"],
                "met" if value["max_s"] < 5 else "not met"))
        text = ("# Elastic reaction times\n\n`python benchmarks/elastic_bench.py --repeats %d` on the "
                "namespace test bed (2 hosts of 2 slots, default discovery interval of 1 s, "
                "training steps of %.2f s sleep plus compute), machine: %s.\n\n%s\n"
                % (args.repeats, args.step_sleep, machine, "\n".join(rows)))
        pathlib.Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
