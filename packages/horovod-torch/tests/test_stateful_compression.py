"""PowerSGD and TopK (horovod.torch.stateful_compression) on real ranks, against numpy and
uncompressed references."""

import os
import pathlib
import sys

import numpy as np
import pytest
import torch

from horovod_testing import run_ranks
from jobs import job_fixture


def lowrank_worker(dtype_name):
    import horovod.torch as hvd
    from horovod.torch.stateful_compression import PowerSGD
    hvd.init()
    dtype = getattr(torch, dtype_name)
    rng = np.random.default_rng(10 + hvd.rank())
    # Each rank's gradient has rank 1: their average has rank <= size <= 2 = r.
    grads = [("w", torch.from_numpy(np.outer(rng.normal(size=12), rng.normal(size=9))).to(dtype)),
             ("conv", torch.from_numpy(np.outer(rng.normal(size=6), rng.normal(size=20))).reshape(6, 4, 5).to(dtype)),
             ("bias", torch.from_numpy(rng.normal(size=12)).to(dtype))]
    compressor = PowerSGD(rank=2, start_iter=0, min_compression_rate=1.0)
    averaged = compressor.reduce(grads, op=hvd.Average)
    summed = compressor.reduce(grads, op=hvd.Sum)
    return ([t.numpy() for t in averaged], [t.numpy() for t in summed],
            {k: float(v.abs().max()) for k, v in compressor.residuals.items()},
            sorted(compressor.q), [compressor.compressed(g.shape) for _, g in grads])


@pytest.mark.parametrize("dtype_name,tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_powersgd_is_exact_on_low_rank_gradients(job, dtype_name, tol):
    _, results = job(f"lowrank.{dtype_name}")
    expected = []
    for rank in range(2):
        rng = np.random.default_rng(10 + rank)
        expected.append([np.outer(rng.normal(size=12), rng.normal(size=9)),
                         np.outer(rng.normal(size=6), rng.normal(size=20)).reshape(6, 4, 5),
                         rng.normal(size=12)])
    mean = [np.mean([e[i] for e in expected], axis=0) for i in range(3)]
    for averaged, summed, residuals, q_names, compressed in results:
        assert compressed == [True, True, False] and q_names == ["conv", "w"]
        for got, want in zip(averaged, mean, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=tol * 10)
        for got, want in zip(summed, mean, strict=True):
            np.testing.assert_allclose(got, 2 * want, rtol=0, atol=tol * 20)
        assert max(residuals.values()) < tol * 10, residuals
    # Every rank holds the same result.
    for got, first in zip(results[1][0], results[0][0], strict=True):
        np.testing.assert_array_equal(got, first)


def training_worker(kind, steps, checkpoint_at=None):
    """A linear model W (8 x 6) trained by SGD, one sample per rank and step, its gradient
    combined by ``kind`` (none, powersgd, topk). With ``checkpoint_at``, the
    compressor's state is saved at that step and loaded into a new compressor that goes on."""
    import horovod.torch as hvd
    from horovod.torch.stateful_compression import PowerSGD, TopK
    hvd.init()
    torch.manual_seed(0)
    target = torch.randn(8, 6, dtype=torch.float64)
    w = torch.zeros(8, 6, dtype=torch.float64, requires_grad=True)
    make = {"none": lambda: None,
            "powersgd": lambda: PowerSGD(rank=hvd.size() + 1, start_iter=5, min_compression_rate=1.0),
            "topk": lambda: TopK(ratio=0.1)}[kind]
    compressor = make()
    generator = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        xs = torch.randn(hvd.size(), 6, generator=generator, dtype=torch.float64)
        x = xs[hvd.rank()]
        loss = ((w @ x - target @ x) ** 2).sum()
        w.grad = None
        loss.backward()
        if compressor is None:
            grad = hvd.allreduce(w.grad, op=hvd.Average, name=f"plain.{step}")
        else:
            grad = compressor.reduce([("w", w.grad)])[0]
        with torch.no_grad():
            w -= 0.05 * grad
        losses.append(float(((w - target) ** 2).sum()))
        if checkpoint_at == step + 1:
            state = compressor.state_dict()
            compressor = make()
            compressor.load_state_dict(state)
    return w.detach().numpy(), losses


def test_powersgd_training_matches_uncompressed_on_low_rank_gradients(job):
    """Per-rank gradients of rank 1, so averaged gradients of rank <= 2 < r = 3: 100 steps with
    PowerSGD (after 5 uncompressed) reach the parameters of uncompressed training to 1e-5. (With
    r = 2 exactly, round-off in the residuals has no rank left to be sent and grows: 1e-5 after
    25 steps, measured.)"""
    plain = job("none.100")[1]
    compressed = job("powersgd.100")[1]
    for (w, _), (w_plain, _) in zip(compressed, plain, strict=True):
        np.testing.assert_allclose(w, w_plain, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(compressed[0][0], compressed[1][0])


@pytest.mark.parametrize("kind", ["powersgd", "topk"])
def test_checkpointed_state_continues_identically(job, kind):
    """The compressor's state saved at step 30 and loaded into a new one: the same training."""
    straight = job(f"{kind}.100")[1]
    resumed = job(f"{kind}.100.resumed")[1]
    for (w, _), (w_resumed, _) in zip(straight, resumed, strict=True):
        np.testing.assert_array_equal(w, w_resumed)


def digits_worker(steps=300, ratio=0.1):
    """The digits model (scikit-learn's 8 x 8 digits, an MLP 64-64-10), trained by
    hvd.DistributedOptimizer(SGD) on full-batch gradients of each rank's half of the images, from the
    same initial parameters: uncompressed, with top-k and error feedback, and with top-k without it.
    Returns each one's final loss over all the images."""
    from sklearn.datasets import load_digits

    import horovod.torch as hvd
    hvd.init()
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    mine_x, mine_y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    compressions = {"none": lambda: hvd.Compression.none, "feedback": lambda: hvd.TopK(ratio=ratio),
                    "no feedback": lambda: hvd.TopK(ratio=ratio, error_feedback=False)}
    final = {}
    for kind, make in compressions.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                             named_parameters=model.named_parameters(), compression=make())
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(mine_x), mine_y).backward()
            optimizer.step()
        with torch.no_grad():
            final[kind] = float(torch.nn.functional.cross_entropy(model(x), y))
    return final


def test_topk_error_feedback_reaches_the_uncompressed_loss(job):
    """On the digits model, 300 steps of top-10 % with error feedback end within 1 % of the
    uncompressed loss; without error feedback measurably worse (over 10 %; measured: 0.0794 and
    0.0955 against 0.0790)."""
    final = job("digits")[1][0]
    assert final["feedback"] <= 1.01 * final["none"], final
    assert final["no feedback"] > 1.1 * final["none"], final


def topk_worker():
    import horovod.torch as hvd
    from horovod.torch.stateful_compression import TopK
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    grad = torch.from_numpy(rng.normal(size=(10, 10)))
    first = TopK(ratio=0.05).reduce([("g", grad)], op=hvd.Sum)[0]
    return grad.numpy(), first.numpy()


def test_topk_sums_every_ranks_largest_entries():
    results = run_ranks(3, topk_worker)
    expected = np.zeros(100)
    for grad, _ in results:
        flat = grad.reshape(-1)
        top = np.argsort(-np.abs(flat))[:5]
        np.add.at(expected, top, flat[top])
    for _, got in results:
        np.testing.assert_array_equal(got.reshape(-1), expected)


def optimizer_worker(kind, steps=100, passes=1, checkpoint_at=None):
    """hvd.DistributedOptimizer(SGD) on Linear(6, 8): one sample per rank and backward pass, so
    the weight's averaged gradient has rank <= 2 * passes and the bias is a vector (sent
    uncompressed). ``kind``: none, or powersgd (r = 2 * passes + 1). With ``checkpoint_at``, the
    optimizer's state_dict (the compressor's state in it) is loaded into a new optimizer there."""
    import horovod.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    target = torch.nn.Linear(6, 8).double()
    first = torch.nn.Linear(6, 8).double()

    def make(state=None):
        """A model and its optimizer, as a new process would make them from a checkpoint."""
        model = torch.nn.Linear(6, 8).double()
        model.load_state_dict(first.state_dict() if state is None else state[0])
        compression = (hvd.PowerSGD(rank=2 * passes + 1, start_iter=5, min_compression_rate=1.0)
                       if kind == "powersgd" else hvd.Compression.none)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
                                             named_parameters=model.named_parameters(), compression=compression,
                                             backward_passes_per_step=passes)
        if state is not None:
            optimizer.load_state_dict(state[1])
        return model, optimizer

    model, optimizer = make()
    generator = torch.Generator().manual_seed(1)
    saved_keys = None
    for step in range(steps):
        optimizer.zero_grad()
        for _ in range(passes):
            xs = torch.randn(hvd.size(), 6, generator=generator, dtype=torch.float64)
            x = xs[hvd.rank()]
            ((model(x) - target(x).detach()) ** 2).sum().backward()
        optimizer.step()
        if checkpoint_at == step + 1:
            state = (model.state_dict(), optimizer.state_dict())
            saved_keys = sorted(state[1].get("horovod_compression", {}))
            model, optimizer = make(state)
    return [p.detach().numpy().copy() for p in model.parameters()], saved_keys


def elastic_sync_worker():
    """TorchState.sync() after rank 1's compressor lost its state: every rank ends with rank 0's
    factors and step, and no residuals."""
    import horovod.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 8).double()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters(),
                                         compression=hvd.PowerSGD(rank=2, start_iter=0, min_compression_rate=1.0))
    generator = torch.Generator().manual_seed(hvd.rank())
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(6, generator=generator, dtype=torch.float64)).sum().backward()
        optimizer.step()
    compressor = optimizer._compression
    had_residuals = bool(compressor.residuals)
    if hvd.rank() == 1:
        compressor.load_state_dict({"step": 0})
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer)
    state.sync()
    return had_residuals, compressor.step, {k: v.numpy() for k, v in compressor.q.items()}, dict(compressor.residuals)


def cast_worker():
    """Cast(bf16).reduce and hvd.allreduce of the bfloat16 casts agree; the optimizer takes a Cast;
    horovod.torch.compression exports the compressors with state."""
    import horovod.torch as hvd
    from horovod.torch.compression import Cast, PowerSGD, StatefulCompressor, TopK
    hvd.init()
    assert PowerSGD is hvd.PowerSGD and TopK is hvd.TopK and issubclass(Cast, StatefulCompressor)
    generator = torch.Generator().manual_seed(hvd.rank())
    grads = [("w", torch.randn(5, 3, generator=generator)), ("b", torch.randn(5, generator=generator))]
    cast = Cast(hvd.Compression.bf16)
    reduced = cast.reduce(grads, op=hvd.Sum)
    direct = [hvd.allreduce(g.to(torch.bfloat16), op=hvd.Sum, name=f"direct.{name}").float() for name, g in grads]
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 5)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=Cast(hvd.Compression.bf16))
    model(torch.randn(4, 3, generator=generator)).sum().backward()
    optimizer.step()
    return ([r.dtype == torch.float32 for r in reduced],
            [torch.equal(r, d) for r, d in zip(reduced, direct, strict=True)],
            cast.state_dict(), [p.detach().numpy().copy() for p in model.parameters()])


# One job of 2 ranks runs every body; each test checks its part.
job = job_fixture({
    "lowrank.float64": lambda: lowrank_worker("float64"),
    "lowrank.float32": lambda: lowrank_worker("float32"),
    "none.100": lambda: training_worker("none", 100),
    "powersgd.100": lambda: training_worker("powersgd", 100),
    "powersgd.100.resumed": lambda: training_worker("powersgd", 100, 30),
    "topk.100": lambda: training_worker("topk", 100),
    "topk.100.resumed": lambda: training_worker("topk", 100, 30),
    "digits": digits_worker,
    "cast": cast_worker,
    "optimizer.none": lambda: optimizer_worker("none"),
    "optimizer.powersgd": lambda: optimizer_worker("powersgd"),
    "optimizer.powersgd.resumed": lambda: optimizer_worker("powersgd", checkpoint_at=40),
    "optimizer.none.passes2": lambda: optimizer_worker("none", steps=50, passes=2),
    "optimizer.powersgd.passes2": lambda: optimizer_worker("powersgd", steps=50, passes=2),
    "elastic.sync": elastic_sync_worker,
}, sizes=(2,), timeout=300)


@pytest.mark.parametrize("variant", ["", ".passes2"])
def test_distributed_optimizer_with_powersgd(job, variant):
    """hvd.DistributedOptimizer(compression=hvd.PowerSGD(...)) against the uncompressed one, with
    one and two backward passes per step: equal to 1e-5, and identical on both ranks."""
    plain = job(f"optimizer.none{variant}")[1]
    compressed = job(f"optimizer.powersgd{variant}")[1]
    for (params, _), (params_plain, _) in zip(compressed, plain, strict=True):
        for got, want in zip(params, params_plain, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    for got, first in zip(compressed[1][0], compressed[0][0], strict=True):
        np.testing.assert_array_equal(got, first)


def test_optimizer_checkpoint_carries_the_compressor_state(job):
    straight = job("optimizer.powersgd")[1]
    resumed = job("optimizer.powersgd.resumed")[1]
    for (params, _), (params_resumed, keys) in zip(straight, resumed, strict=True):
        assert keys == ["q", "residuals", "step"], keys
        for got, want in zip(params_resumed, params, strict=True):
            np.testing.assert_array_equal(got, want)


def test_elastic_sync_shares_factors_and_zeroes_residuals(job):
    results = job("elastic.sync")[1]
    (had0, step0, q0, res0), (had1, step1, q1, res1) = results
    assert had0 and had1
    assert step0 == step1 == 3 and res0 == {} and res1 == {}
    assert sorted(q0) == sorted(q1) == ["weight"]
    np.testing.assert_array_equal(q0["weight"], q1["weight"])


def test_cast_is_a_compressor_in_the_same_interface(job):
    results = job("cast")[1]
    for dtypes_kept, equal, state, _ in results:
        assert dtypes_kept == [True, True] and equal == [True, True] and state == {"step": 1}
    for got, want in zip(results[1][3], results[0][3], strict=True):
        np.testing.assert_array_equal(got, want)


ELASTIC_SCRIPT = pathlib.Path(__file__).resolve().parent / "elastic_scripts" / "powersgd_elastic_train.py"


def test_elastic_reset_from_4_to_2_ranks_rebuilds_the_state_alike(tmp_path):
    """horovodrun elastic, 4 ranks then 2 (a host leaves): before every step, every rank of the
    world holds the same compressor step, the same factors and the same parameters; after the
    reset the residuals start empty on every rank (those of the ranks that left are lost, and a
    rank's own no longer match its share of the batch), and are rebuilt alike from there."""
    from horovod_testing.elastic import ElasticJob, check_finals, discovery_script
    script, set_hosts = discovery_script(str(tmp_path))
    set_hosts(["localhost:2", "127.0.0.1:2"])
    args = ["--network-interface", "lo", "-np", "4", "--min-np", "2", "--max-np", "4",
            "--host-discovery-script", script, sys.executable, str(ELASTIC_SCRIPT), "24"]
    env = dict(os.environ, STEP_SLEEP="0.1", OMP_NUM_THREADS="1")
    with ElasticJob(args, env, timeout=240) as job:
        job.wait_for(lambda: sum(r["size"] == 4 and r["rank"] == 0 for r in job.steps()) >= 6, "steps at size 4",
                     timeout=180)
        set_hosts(["localhost:2"])
        code, output = job.finish()
    assert code == 0, output
    assert job.sizes() == [4, 2], output
    by_step = {}
    for record in job.steps():
        by_step.setdefault((record["size"], record["steps"]), []).append(record)
    for (size, step), records in by_step.items():
        if len(records) != size:
            continue  # a step the reset interrupted on some ranks
        same = {(r["compressor_step"], r["q"], r["residuals"], r["params"]) for r in records}
        assert len(same) == 1, (size, step, records)
    first_at_2 = min(step for size, step in by_step if size == 2)
    assert all(r["residuals"] == 0 for r in by_step[(2, first_at_2)]), by_step[(2, first_at_2)]
    assert all(r["residuals"] > 0 for r in by_step[(2, first_at_2 + 1)]), by_step[(2, first_at_2 + 1)]
    assert all(r["compressor_step"] > 2 for r in by_step[(2, first_at_2)])
    check_finals(job, key="params")


def process_set_worker():
    """Ranks 0 and 2 of 3 in a process set: TopK and PowerSGD combine the members' gradients only,
    and hvd.DistributedOptimizer(process_set=...) with PowerSGD averages over the members while
    rank 1, outside the set, keeps its own gradient."""
    import horovod.torch as hvd
    members = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[members])
    rank = hvd.rank()
    rng = np.random.default_rng(20 + rank)
    grad = torch.from_numpy(rng.normal(size=(10, 10)))
    lowrank = torch.from_numpy(np.outer(rng.normal(size=12), rng.normal(size=9)))
    out = {}
    if members.included():
        out["topk"] = hvd.TopK(ratio=0.05).reduce([("g", grad)], op=hvd.Sum, process_set=members)[0].numpy()
        out["powersgd"] = hvd.PowerSGD(rank=2, start_iter=0, min_compression_rate=1.0).reduce(
            [("w", lowrank)], process_set=members)[0].numpy()
    weight = torch.nn.Parameter(torch.zeros(12, 9, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), named_parameters=[("weight", weight)],
                                         compression=hvd.PowerSGD(rank=2, start_iter=0, min_compression_rate=1.0),
                                         process_set=members)
    (weight * lowrank).sum().backward()
    optimizer.step()
    out["step"] = weight.detach().numpy().copy()
    # Every rank waits for the members' collectives before any shuts down.
    hvd.barrier()
    hvd.shutdown()
    return grad.numpy(), lowrank.numpy(), out


def test_process_sets():
    results = run_ranks(3, process_set_worker, timeout=120)
    expected_topk = np.zeros(100)
    for rank in (0, 2):
        flat = results[rank][0].reshape(-1)
        top = np.argsort(-np.abs(flat))[:5]
        np.add.at(expected_topk, top, flat[top])
    mean = (results[0][1] + results[2][1]) / 2
    for rank in (0, 2):
        _, _, out = results[rank]
        np.testing.assert_array_equal(out["topk"].reshape(-1), expected_topk)
        np.testing.assert_allclose(out["powersgd"], mean, rtol=0, atol=1e-12)
        np.testing.assert_allclose(out["step"], -mean, rtol=0, atol=1e-12)
    _, own, out = results[1]
    assert sorted(out) == ["step"]
    np.testing.assert_array_equal(out["step"], -own)


def test_arguments_are_checked():
    from horovod.torch.stateful_compression import PowerSGD, TopK
    for bad in ({"rank": 0}, {"start_iter": -1}, {"min_compression_rate": 0.5}):
        with pytest.raises(ValueError):
            PowerSGD(**bad)
    with pytest.raises(ValueError):
        TopK(ratio=0)
    from horovod.torch.compression import Cast
    with pytest.raises(ValueError):
        Cast("bf16")
