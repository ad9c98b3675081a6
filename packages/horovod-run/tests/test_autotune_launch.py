"""horovodrun's autotune flags and config-file section, end to end: the workers get the
HOROVOD_AUTOTUNE* variables, the engine tunes while they train, rank 0 writes the CSV log, and every
rank ends with the same parameters (spec runner.md §2.2, §3; core.md §12)."""

import csv
import json
import subprocess
import sys
import textwrap

LAUNCH_TIMEOUT_S = 240
MB = 1024 * 1024

# Trains with one allreduce per tensor until no rank's engine is tuning any more (agreed with a
# Max allreduce each step), then prints its autotune variables and the parameters in force.
TRAINING_WORKER = textwrap.dedent("""
    import json, os
    import numpy as np
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics

    basics = HorovodBasics()
    basics.init()
    sizes = [5, 4000, 70000, 300]
    for step in range(3000):
        handles = []
        for i, n in enumerate(sizes):
            x = np.ones(n, dtype=np.float32)
            handles.append((ops.allreduce_async([x], [x], ["g%d" % i], 1), x))
        for h, x in handles:
            ops.wait(h)
            assert (x == basics.size()).all()
        flag = np.array([int(_core.tuned_parameters()["tuning"])], dtype=np.int32)
        ops.wait(ops.allreduce_async([flag], [flag], ["tuning"], 4))
        if flag[0] == 0:
            break
    params = _core.tuned_parameters()
    env = {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_AUTOTUNE")
           or k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")}
    basics.shutdown()
    print("RESULT " + json.dumps({"env": env, "params": params, "steps": step + 1}))
""")


def _horovodrun(args):
    return subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--gloo"] + args,
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)


def _results(stdout, np_):
    results = {}
    for line in stdout.splitlines():
        prefix, _, rest = line.partition(":")
        if rest.startswith("RESULT "):
            results[int(prefix.split("]")[0].lstrip("["))] = json.loads(rest[len("RESULT "):])
    assert sorted(results) == list(range(np_)), stdout
    return results


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce", "cache_enabled",
                       "cycle_time_ms", "tensor_fusion_threshold", "score"]
    return [[float(v) for v in row] for row in rows[1:]]


def _check_same_final(results, rows):
    # The last row is the configuration with the best mean score (a configuration may be scored twice).
    final = rows[-1]
    means = {}
    for r in rows[:-1]:
        means.setdefault(tuple(r[:6]), []).append(r[6])
    best = max(means, key=lambda config: sum(means[config]) / len(means[config]))
    assert tuple(final[:6]) == best
    assert abs(final[6] - sum(means[best]) / len(means[best])) <= 1e-4 * final[6]
    params = [r["params"] for r in results.values()]
    assert all(p == params[0] for p in params)
    assert params[0]["tuning"] is False
    assert params[0]["cache_enabled"] == bool(final[3])
    assert abs(params[0]["cycle_time_ms"] - final[4]) <= 1e-5 * final[4]
    assert abs(params[0]["fusion_threshold_bytes"] - final[5] * MB) <= 1e-5 * final[5] * MB + 1
    assert len({r["steps"] for r in results.values()}) == 1


def test_autotune_flags_reach_the_engine(tmp_path):
    worker = tmp_path / "train.py"
    worker.write_text(TRAINING_WORKER)
    log = tmp_path / "tune.csv"
    run = _horovodrun(["-np", "2", "-H", "localhost:2", "--autotune", "--autotune-log-file", str(log),
                       "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "2",
                       "--autotune-bayes-opt-max-samples", "4", "--autotune-gaussian-process-noise", "0.5",
                       "--fusion-threshold-mb", "2", sys.executable, str(worker)])
    assert run.returncode == 0, run.stderr
    results = _results(run.stdout, 2)
    for result in results.values():
        assert result["env"] == {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log),
                                 "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2",
                                 "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "4",
                                 "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5",
                                 "HOROVOD_FUSION_THRESHOLD": str(2 * MB)}
    rows = _rows(log)
    # --fusion-threshold-mb fixes the fusion threshold: the initial parameters, cycle time (four samples)
    # and cache (two), then the choice.
    assert len(rows) == 1 + 4 + 2 + 1
    assert [r[4] for r in rows[:5]] == [1.0, 5.0, 50.0, 25.0, 10.0]
    assert all(r[5] == 2.0 for r in rows)
    assert [r[3] for r in rows[5:7]] == [0.0, 1.0]
    _check_same_final(results, rows)
    assert results[0]["params"]["fusion_threshold_bytes"] == 2 * MB


def test_autotune_config_file_section(tmp_path):
    worker = tmp_path / "train.py"
    worker.write_text(TRAINING_WORKER)
    log = tmp_path / "tune.csv"
    config = tmp_path / "config.yaml"
    config.write_text(textwrap.dedent(f"""
        params:
          cache_capacity: 256
        autotune:
          enabled: true
          log_file: {log}
          warmup_samples: 0
          steps_per_sample: 2
          bayes_opt_max_samples: 5
          gaussian_process_noise: 0.3
    """))
    run = _horovodrun(["-np", "2", "--config-file", str(config), sys.executable, str(worker)])
    assert run.returncode == 0, run.stderr
    results = _results(run.stdout, 2)
    assert results[1]["env"]["HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"] == "5"
    assert results[1]["env"]["HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"] == "0.3"
    assert results[1]["env"]["HOROVOD_CACHE_CAPACITY"] == "256"
    rows = _rows(log)
    # The cache capacity is fixed by the config file: the initial parameters, fusion and cycle (four test
    # points and one proposal), then the choice.
    assert len(rows) == 1 + 5 + 1
    assert [(r[5], r[4]) for r in rows[:5]] == [(128.0, 1.0), (4.0, 5.0), (32.0, 50.0), (16.0, 25.0), (8.0, 10.0)]
    assert all(r[3] == 1.0 for r in rows)
    _check_same_final(results, rows)
