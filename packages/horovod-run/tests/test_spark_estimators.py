"""The Spark Estimators (horovod.spark.torch, .keras, .lightning) on a real Spark standalone
cluster (a master and two workers, started once for the module by test_spark's ``Cluster`` under
build/spark-est-test and stopped by PID), with real rank processes and real frameworks.

Each estimator is fitted by running its docs example (docs/examples/spark/estimator_*.py) with a
backend that keeps every rank's result; the tests then check those results against a
single-process run on the same global batches. The data (estimator_data.py): 3000 rows with a
vector column (dense and sparse rows), an array column and a scalar column, labelled by a linear
rule the models can learn; 20% held out for validation. Run by ``nox -s tests-spark``.
"""

import os
import pathlib
import shutil
import signal
import sys
import time

import cloudpickle
import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402

import test_spark  # noqa: E402
from horovod.spark.common import data as hvd_data  # noqa: E402
from horovod.spark.common import store as hvd_store  # noqa: E402
from horovod.spark.common import util  # noqa: E402
from horovod.spark.common.backend import SparkBackend  # noqa: E402
from horovod.spark.common.reader import BatchReader, steps_per_epoch  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = pathlib.Path(__file__).resolve().parents[3]
BASE = ROOT / "build" / "spark-est-test"
EXAMPLES = ROOT / "docs" / "examples" / "spark"
ROWS = 3000
SEED = 7


def _example(name):
    """docs/examples/spark/<name>.py as a module whose functions and classes travel by value."""
    import importlib.util
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


@pytest.fixture(scope="module")
def sc():
    cluster = test_spark.Cluster(base=BASE)
    cluster.start()
    with test_spark.spark_context(cluster, test_spark.WORKERS) as context:
        yield context
    shutil.rmtree(BASE, ignore_errors=True)


@pytest.fixture(scope="module")
def spark(sc):
    return SparkSession(sc)


@pytest.fixture(scope="module")
def frame(spark):
    return _example("estimator_data").make_dataframe(spark, ROWS)


class RecordingBackend(SparkBackend):
    """SparkBackend that keeps every rank's result."""

    def run(self, fn, args=(), kwargs=None, env=None):
        self.results = super().run(fn, args, kwargs, env)
        return self.results


# ---------------------------------------------------------------------------------------------
# Torch.

def torch_estimator(store, backend, run_id, epochs=4, callbacks=()):
    return _example("estimator_torch").make_estimator(store, backend=backend, epochs=epochs, seed=SEED,
                                                      run_id=run_id, callbacks=callbacks)


@pytest.fixture(scope="module")
def torch_fit(sc, tmp_path_factory):
    """docs/examples/spark/estimator_torch.py run on the cluster (fit, transform, save, load)."""
    example = _example("estimator_torch")
    path = str(tmp_path_factory.mktemp("torch-store"))
    backend = RecordingBackend(num_proc=2, start_timeout=120, verbose=0)
    initial = example.make_estimator(hvd_store.Store.create(path), seed=SEED).getModel()
    start = time.monotonic()
    model = example.main(["--store", path], backend=backend)
    print("torch example (fit, transform, save, load): %.1f s" % (time.monotonic() - start))
    return example.make_estimator(hvd_store.Store.create(path), seed=SEED), model, backend, \
        hvd_store.Store.create(path), initial


def _rank_models(backend):
    return [cloudpickle.loads(r["model_and_optimizer"])[0] for r in backend.results]


def test_torch_ranks_read_disjoint_shards_covering_the_split(torch_fit, frame):
    import pyarrow.dataset as ds

    _, _, _, store, _ = torch_fit
    meta = hvd_data.describe(store, 0)
    fs, local = store.get_arrow_filesystem()
    groups = [(local(p), g, n) for p, g, n in meta["train_row_groups"]]
    columns = ["vec", "arr", "x", "label"]
    whole = ds.dataset(local(meta["train_path"]), format="parquet", filesystem=fs).to_table(columns=columns)
    every = {tuple(np.concatenate([np.ravel(v) for v in row])) for row in
             zip(*[hvd_data_numpy(whole, c) for c in columns], strict=True)}
    seen = []
    steps = steps_per_epoch(groups, 2, 32)
    for rank in range(2):
        reader = BatchReader(groups, fs, columns, meta["kinds"], 32, rank, 2, steps=steps, seed=SEED)
        rows = set()
        count = 0
        for batch in reader.epoch(0):
            assert len(batch["x"]) == 32
            count += 1
            for row in zip(*[batch[c] for c in columns], strict=True):
                rows.add(tuple(np.concatenate([np.ravel(v) for v in row])))
        assert count == steps
        seen.append(rows)
    print("rank rows: %d and %d of %d training rows, %d validation rows"
          % (len(seen[0]), len(seen[1]), len(every), meta["val_rows"]))
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == every
    assert meta["train_rows"] + meta["val_rows"] == ROWS
    assert 0.15 < meta["val_rows"] / ROWS < 0.25
    # The validation split is the rest of the DataFrame's rows: none of them in the training split.
    val = ds.dataset(local(meta["val_path"]), format="parquet", filesystem=fs).to_table(columns=columns)
    val_rows = {tuple(np.concatenate([np.ravel(v) for v in row])) for row in
                zip(*[hvd_data_numpy(val, c) for c in columns], strict=True)}
    assert len(val_rows) == meta["val_rows"] and not val_rows & every
    frame_rows = {tuple(np.concatenate([r["vec"].toArray(), r["arr"], [r["x"], r["label"]]]))
                  for r in frame.select(*columns).collect()}
    assert frame_rows == every | val_rows


def hvd_data_numpy(table, column):
    from horovod.spark.common.reader import _to_numpy

    return _to_numpy(table.select([column]), {"arr": ("array", 3), "vec": ("array", 4)})[column]


def test_torch_fit_matches_single_process_and_learns(torch_fit):
    import torch

    estimator, model, backend, store, initial = torch_fit
    ranks = _rank_models(backend)
    for a, b in zip(ranks[0].state_dict().values(), ranks[1].state_dict().values(), strict=True):
        assert torch.equal(a, b), "the ranks' weights differ"

    # The same global batches in one process: rank 0's and rank 1's batch of each step, the loss
    # the mean of the two, the learning rate scaled by 2 as the ranks scale it.
    meta = hvd_data.describe(store, 0)
    fs, local = store.get_arrow_filesystem()
    groups = [(local(p), g, n) for p, g, n in meta["train_row_groups"]]
    columns = ["vec", "arr", "x", "label"]
    steps = steps_per_epoch(groups, 2, 32)
    reference = initial
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05 * 2, momentum=0.9)
    readers = [BatchReader(groups, fs, columns, meta["kinds"], 32, r, 2, steps=steps, seed=SEED) for r in range(2)]
    for epoch in range(4):
        for b0, b1 in zip(readers[0].epoch(epoch), readers[1].epoch(epoch), strict=True):
            optimizer.zero_grad()
            loss = 0
            for batch in (b0, b1):
                inputs = [torch.from_numpy(batch[c].astype(np.float32)) for c in ("vec", "arr", "x")]
                loss = loss + torch.nn.functional.cross_entropy(reference(*inputs),
                                                                torch.from_numpy(batch["label"])) / 2
            loss.backward()
            optimizer.step()
    worst = max(float((a - b).abs().max()) for a, b in
                zip(ranks[0].state_dict().values(), reference.state_dict().values(), strict=True))
    print("torch: largest weight difference to the single-process run: %.3g" % worst)
    assert worst < 1e-5
    history = model.getHistory()
    print("torch history:", history)
    assert len(history["loss"]) == 4 and history["val_accuracy"][-1] >= 0.95
    # The returned optimizer's learning rate is the one given.
    assert model.getOptimizer().param_groups[0]["lr"] == pytest.approx(0.05)


def test_torch_transform_save_load_pipeline(torch_fit, frame, tmp_path):
    import torch
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import SQLTransformer

    from horovod.spark.torch import TorchEstimator, TorchModel

    estimator, model, _, _, _ = torch_fit
    df = frame
    out = model.transform(df)
    assert "label__output" in out.columns and out.count() == ROWS
    rows = out.orderBy("id").select("vec", "arr", "x", "label", "label__output").collect()
    predicted = np.array([np.argmax(r["label__output"]) for r in rows])
    truth = np.array([r["label"] for r in rows])
    print("torch transform accuracy: %.4f" % (predicted == truth).mean())
    assert (predicted == truth).mean() >= 0.95
    # The same outputs as the model applied here.
    net = model.getModel().eval()
    with torch.no_grad():
        local_out = net(torch.tensor(np.array([r["vec"].toArray() for r in rows]), dtype=torch.float32),
                        torch.tensor([r["arr"] for r in rows], dtype=torch.float32),
                        torch.tensor([r["x"] for r in rows], dtype=torch.float32)).numpy()
    np.testing.assert_allclose(np.array([r["label__output"] for r in rows]), local_out, rtol=1e-5, atol=1e-6)

    with pytest.raises(ValueError, match="already has column"):
        model.transform(out)

    path = str(tmp_path / "torch-model")
    model.save(path)
    loaded = TorchModel.load(path)
    assert loaded.getFeatureColumns() == ["vec", "arr", "x"] and loaded.getHistory() == model.getHistory()
    again = loaded.transform(df).orderBy("id").select("label__output").collect()
    assert [r[0] for r in again] == [r["label__output"] for r in rows]

    pipeline = PipelineModel(stages=[SQLTransformer(statement="SELECT *, x * 2 AS x2 FROM __THIS__"), model])
    pipeline.save(str(tmp_path / "pipeline-model"))
    restored = PipelineModel.load(str(tmp_path / "pipeline-model"))
    assert [r[0] for r in restored.transform(df).orderBy("id").select("label__output").collect()] == \
        [r["label__output"] for r in rows]

    # An unfitted estimator in a Pipeline saves and loads with its params.
    Pipeline(stages=[estimator]).save(str(tmp_path / "pipeline"))
    stage = Pipeline.load(str(tmp_path / "pipeline")).getStages()[0]
    assert isinstance(stage, TorchEstimator)
    assert stage.getBatchSize() == 32 and stage.getFeatureCols() == ["vec", "arr", "x"]
    assert stage.getRandomSeed() == SEED and stage.getValidation() == 0.2


class KillRank:
    """Callback: SIGKILLs rank ``rank``'s process at ``step`` of ``epoch``."""

    def __init__(self, rank, epoch, step):
        self.rank, self.epoch, self.step = rank, epoch, step

    def on_batch_end(self, epoch, step, logs):
        import horovod.torch as hvd
        if hvd.rank() == self.rank and epoch == self.epoch and step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def test_torch_killed_rank_fails_fit_and_run_resumes(sc, frame, tmp_path_factory):
    store = hvd_store.Store.create(str(tmp_path_factory.mktemp("torch-resume")))
    estimator = torch_estimator(store, SparkBackend(num_proc=2, start_timeout=120, verbose=0), "resumed", epochs=3,
                                callbacks=[KillRank(1, 1, 5)])
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"Process name: 1\n") as failure:
        estimator.fit(frame)
    took = time.monotonic() - start
    print("fit with a killed rank raised after %.1f s: %s" % (took, str(failure.value)[:300]))
    assert took < 120
    deadline = time.monotonic() + 20
    while sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not sc.statusTracker().getActiveJobsIds(), "a Spark job was left running"
    assert store.exists(store.get_checkpoint_path("resumed"))

    backend = RecordingBackend(num_proc=2, start_timeout=120, verbose=0)
    resumed = torch_estimator(store, backend, "resumed", epochs=3)
    model = resumed.fit(frame)
    assert [r["start_epoch"] for r in backend.results] == [1, 1]
    assert len(model.getHistory()["loss"]) == 3


# ---------------------------------------------------------------------------------------------
# Without a cluster.

def test_store_create_and_paths(tmp_path):
    store = hvd_store.Store.create(str(tmp_path))
    assert isinstance(store, hvd_store.FilesystemStore)
    assert store.prefix_path == "file://" + str(tmp_path)
    assert store.get_train_data_path(3) == "file://%s/intermediate_train_data.3" % tmp_path
    assert store.get_checkpoint_path("r1") == "file://%s/runs/r1/checkpoint" % tmp_path
    store.write(store.get_checkpoint_path("r1"), b"abc")
    assert store.read(store.get_checkpoint_path("r1")) == b"abc"
    assert issubclass(hvd_store.LocalStore, hvd_store.FilesystemStore)
    memory = hvd_store.Store.create("memory://hvd-est-test")
    memory.write(memory.get_checkpoint_path("r"), b"x")
    assert memory.read(memory.get_checkpoint_path("r")) == b"x"
    memory.remove("memory://hvd-est-test")
    with pytest.raises(ValueError, match="prefix_path"):
        hvd_store.Store.create("")


def test_hdfs_store_parse_url_and_filesystem():
    store = hvd_store.Store.create("hdfs://namenode:9000/user/hvd")
    assert isinstance(store, hvd_store.HDFSStore)
    assert store._hdfs_kwargs["host"] == "namenode" and store._hdfs_kwargs["port"] == 9000
    assert store.get_train_data_path() == "hdfs://namenode:9000/user/hvd/intermediate_train_data"
    default = hvd_store.HDFSStore("/user/hvd")
    assert default._hdfs_kwargs["host"] == "default" and default._hdfs_kwargs["port"] == 0
    given = hvd_store.HDFSStore("hdfs:///user/hvd", host="nn2", port=8020, user="alice")
    assert (given._hdfs_kwargs["host"], given._hdfs_kwargs["port"], given._hdfs_kwargs["user"]) == ("nn2", 8020,
                                                                                                   "alice")
    with pytest.raises(ValueError, match="hdfs://"):
        hvd_store.HDFSStore("s3://bucket/x")
    # The connection it makes is pyarrow's HadoopFileSystem; without libhdfs here it fails in it.
    connect = store._get_filesystem_fn()
    assert connect.__code__.co_names.count("HadoopFileSystem") == 1
    with pytest.raises(OSError):
        connect()


def test_estimator_params_defaults_and_errors():
    import torch

    from horovod.spark.torch import TorchEstimator

    est = TorchEstimator()
    assert est.getBatchSize() == 32 and est.getEpochs() == 1 and est.getShuffle() is True
    assert est.getMetrics() == [] and est.getPartitionsPerProcess() == 10 and est.getTrainReaderNumWorker() == 2
    assert est.getShufflingBufferSize() is None and est.getInMemoryCacheAll() is False and est.getUseGpu() is True
    with pytest.raises(TypeError):
        TorchEstimator(2)
    model = torch.nn.Linear(2, 1)
    good = dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss=torch.nn.MSELoss(),
                feature_cols=["a"], label_cols=["b"], store=hvd_store.Store.create("memory://p"))
    with pytest.raises(ValueError, match="loss or loss_constructors"):
        TorchEstimator(loss_constructors=[torch.nn.MSELoss], **good)._check_common()
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        TorchEstimator(backward_passes_per_step=0, **good)._check_common()
    with pytest.raises(ValueError, match="num_proc or backend"):
        TorchEstimator(num_proc=2, backend=SparkBackend(2), **good)._check_common()
    with pytest.raises(ValueError, match="validation"):
        TorchEstimator(validation=1.5, **good)._check_common()
    with pytest.raises(ValueError, match="torch.nn.Module"):
        TorchEstimator(**dict(good, model="nope"))._check_common()
    assert util.prepare_data is hvd_data.prepare_data


def _parquet(folder, rows_per_file):
    """Parquet files of one row group each, as prepare_data writes them: an id, an array of 2 and
    a label; returns their row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    groups, start = [], 0
    for i, n in enumerate(rows_per_file):
        ids = np.arange(start, start + n)
        table = pa.table({"id": ids, "arr": pa.array([[float(v), -float(v)] for v in ids]), "y": ids % 2})
        path = str(folder / ("part-%d.parquet" % i))
        pq.write_table(table, path)
        groups.append((path, 0, n))
        start += n
    return groups


KINDS = {"id": ("scalar", None), "arr": ("array", 2), "y": ("scalar", None)}


def test_reader_shards_steps_seed_cache_and_transformation(tmp_path):
    import pyarrow.fs

    groups = _parquet(tmp_path, [10, 7, 9, 4, 8])  # 38 rows; rank 0: 27 rows, rank 1: 11
    fs = pyarrow.fs.LocalFileSystem()
    steps = steps_per_epoch(groups, 2, 4)
    assert steps == 7  # ceil(27 / 4): the largest shard decides; the smaller one wraps

    def ids(reader, epoch):
        return [b["id"].tolist() for b in reader.epoch(epoch)]

    seen = []
    for rank in range(2):
        reader = BatchReader(groups, fs, ["id", "arr"], KINDS, 4, rank, 2, steps=steps, seed=3)
        batches = ids(reader, 0)
        assert len(batches) == steps and all(len(b) == 4 for b in batches)
        seen.append({i for b in batches for i in b})
        assert batches == ids(BatchReader(groups, fs, ["id", "arr"], KINDS, 4, rank, 2, steps=steps, seed=3), 0)
        assert batches != ids(reader, 1), "each epoch shuffles anew"
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(38))

    # One pass without steps (validation): every row once, the last batch smaller; the
    # transformation runs on each batch; a cached shard gives the same batches again.
    calls = []

    def double(batch):
        calls.append(len(batch["id"]))
        return dict(batch, arr=batch["arr"] * 2)

    reader = BatchReader(groups, fs, ["id", "arr"], KINDS, 5, 0, 1, shuffle=False, inmemory_cache=True,
                         transformation_fn=double)
    batches = list(reader.epoch(0))
    assert [len(b["id"]) for b in batches] == [5] * 7 + [3]
    assert np.concatenate([b["id"] for b in batches]).tolist() == list(range(38))
    np.testing.assert_array_equal(batches[0]["arr"], [[0, -0], [2, -2], [4, -4], [6, -6], [8, -8]])
    assert len(reader._cache) == 5 and sum(calls) == 38
    assert [b["id"].tolist() for b in reader.epoch(1)] == [b["id"].tolist() for b in batches]

    # A shuffle buffer smaller than the shard mixes rows within windows of row groups only.
    reader = BatchReader(groups, fs, ["id"], KINDS, 2, 0, 1, steps=19, seed=1, shuffle_buffer_size=8)
    assert sorted(i for b in reader.epoch(0) for i in b["id"].tolist()) == list(range(38))


def test_reader_errors_reach_the_training_thread(tmp_path):
    import pyarrow as pa
    import pyarrow.fs
    import pyarrow.parquet as pq

    path = str(tmp_path / "ragged.parquet")
    pq.write_table(pa.table({"arr": pa.array([[1.0, 2.0], [3.0]])}), path)
    reader = BatchReader([(path, 0, 2)], pyarrow.fs.LocalFileSystem(), ["arr"], {"arr": ("array", 2)}, 1)
    with pytest.raises(ValueError, match=r"arrays of \[1, 2\] elements"):
        list(reader.epoch(0))

    def broken(batch):
        raise KeyError("no such column")

    reader = BatchReader(_parquet(tmp_path, [3]), pyarrow.fs.LocalFileSystem(), ["id"], KINDS, 1,
                         transformation_fn=broken)
    with pytest.raises(KeyError, match="no such column"):
        list(reader.epoch(0))
    with pytest.raises(ValueError, match="batch_size"):
        BatchReader([], None, ["id"], KINDS, 0)


KERAS_RESUME = """
import pathlib, sys
import keras, numpy as np, pyarrow as pa, pyarrow.parquet as pq
from horovod.spark.common import data
from horovod.spark.common.store import Store
from horovod.spark.keras import KerasEstimator

base = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 3))
y = (x @ [1.0, -2.0, 0.5] > 0).astype(np.int64)


def store_at(name):
    store = Store.create(str(base / name))
    folder = pathlib.Path(store.get_train_data_path(0)[len("file://"):])
    folder.mkdir(parents=True)
    for i in range(4):
        pq.write_table(pa.table({"x": pa.array(list(x[i::4])), "y": y[i::4]}), str(folder / ("p%d.parquet" % i)))
    return store


def fit(store, epochs):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    est = KerasEstimator(store=store, model=model, optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                         loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), feature_cols=["x"],
                         label_cols=["y"], batch_size=16, epochs=epochs, random_seed=3, run_id="r", verbose=0)
    est._check_common()
    return est._remote_trainer(data.describe(store, 0), "r")()


straight = fit(store_at("straight"), 2)
store = store_at("resumed")
first, second = fit(store, 1), fit(store, 2)
print("start epochs", first["start_epoch"], second["start_epoch"])
print("difference %.3g" % max(float(np.abs(a - b).max()) for a, b in zip(straight["weights"], second["weights"])))
"""


def test_keras_resume_restores_weights_and_optimizer_slots(tmp_path):
    """The Keras rank function as one rank (a process of its own): 1 epoch, then the same run_id
    to 2 epochs, ends with the weights of 2 epochs straight (momentum included)."""
    import subprocess

    (tmp_path / "tmp").mkdir()
    script = tmp_path / "resume.py"
    script.write_text(KERAS_RESUME)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "stores")], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, KERAS_BACKEND="tensorflow", TMPDIR=str(tmp_path / "tmp")))
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout)
    assert "start epochs 0 1" in out.stdout
    assert float(out.stdout.split("difference")[1]) < 1e-6


def test_prepare_data_checks_columns(spark, tmp_path):
    store = hvd_store.Store.create(str(tmp_path))
    df = spark.createDataFrame([("a", 1.0)], "s string, y double")
    with pytest.raises(ValueError, match="not in the DataFrame"):
        with util.prepare_data(2, store, df, ["y"], ["missing"]):
            pass
    with pytest.raises(ValueError, match="numeric scalars"):
        with util.prepare_data(2, store, df, ["y"], ["s"]):
            pass
    with pytest.raises(ValueError, match="fraction"):
        with util.prepare_data(2, store, df, ["y"], ["y"], validation=2.0):
            pass
    assert not hvd_data._training_cache._entries


def test_prepare_data_validation_column(frame, tmp_path):
    df = frame
    store = hvd_store.Store.create(str(tmp_path))
    with util.prepare_data(2, store, df, ["label"], ["vec", "arr", "x"], validation="is_val",
                           partitions_per_process=3) as idx:
        assert idx == 0
        meta = hvd_data.describe(store, idx)
        # 2 ranks x 3 partitions x 0.8 (no fraction: all training partitions).
        assert len({p for p, _, _ in meta["train_row_groups"]}) == 6
        assert meta["val_rows"] == ROWS // 5 and meta["train_rows"] == ROWS - ROWS // 5
        assert meta["kinds"]["vec"] == ("array", 4) and meta["kinds"]["x"] == ("scalar", None)
        with util.prepare_data(2, store, df, ["label"], ["vec", "arr", "x"], validation="is_val") as again:
            assert again == idx
    assert not hvd_data._training_cache._entries


# ---------------------------------------------------------------------------------------------
# Keras (Keras 3 on TensorFlow).

def test_keras_example_matches_single_process_and_learns(sc, frame, tmp_path_factory):
    """docs/examples/spark/estimator_keras.py (fit, transform, save, load) on the cluster."""
    import keras

    example = _example("estimator_keras")
    path = str(tmp_path_factory.mktemp("keras-store"))
    backend = RecordingBackend(num_proc=2, start_timeout=120, verbose=0)
    initial = example.build_model(SEED).get_weights()
    start = time.monotonic()
    fitted = example.main(["--store", path], backend=backend)
    print("keras example (fit, transform, save, load): %.1f s" % (time.monotonic() - start))
    w0, w1 = (r["weights"] for r in backend.results)
    for a, b in zip(w0, w1, strict=True):
        np.testing.assert_array_equal(a, b)

    # One process, the same global batches (rank 0's then rank 1's rows), learning rate x 2.
    store = hvd_store.Store.create(path)
    meta = hvd_data.describe(store, 0)
    fs, local = store.get_arrow_filesystem()
    groups = [(local(p), g, n) for p, g, n in meta["train_row_groups"]]
    columns = ["vec", "arr", "x", "label"]
    steps = steps_per_epoch(groups, 2, 32)
    reference = example.build_model(SEED)
    reference.set_weights(initial)
    reference.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    readers = [BatchReader(groups, fs, columns, meta["kinds"], 32, r, 2, steps=steps, seed=SEED) for r in range(2)]
    for epoch in range(3):
        for b0, b1 in zip(readers[0].epoch(epoch), readers[1].epoch(epoch), strict=True):
            xs = [np.concatenate([b0[c], b1[c]]).astype(np.float32) for c in ("vec", "arr", "x")]
            reference.train_on_batch(xs, np.concatenate([b0["label"], b1["label"]]))
    worst = max(float(np.abs(a - b).max()) for a, b in zip(w0, reference.get_weights(), strict=True))
    print("keras: largest weight difference to the single-process run: %.3g" % worst)
    assert worst < 1e-5
    history = fitted.getHistory()
    print("keras history:", history)
    assert len(history["loss"]) == 3 and history["val_accuracy"][-1] >= 0.95

    from horovod.spark.keras import KerasModel

    rows = fitted.transform(frame).orderBy("id").select("label", "label__output").collect()
    assert len(rows) == ROWS
    accuracy = np.mean([np.argmax(r["label__output"]) == r["label"] for r in rows])
    print("keras transform accuracy: %.4f" % accuracy)
    assert accuracy >= 0.95
    loaded = KerasModel.load(path + "/keras-model")  # saved by the example
    again = loaded.transform(frame).orderBy("id").select("label__output").collect()
    assert [r[0] for r in again] == [r["label__output"] for r in rows]


# ---------------------------------------------------------------------------------------------
# Lightning.

def test_lightning_example_matches_single_process_and_learns(sc, frame, tmp_path_factory):
    """docs/examples/spark/estimator_lightning.py (fit, transform) on the cluster."""
    import torch

    from horovod.spark.lightning import TorchEstimator

    example = _example("estimator_lightning")
    path = str(tmp_path_factory.mktemp("lightning-store"))
    store = hvd_store.Store.create(path)
    backend = RecordingBackend(num_proc=2, start_timeout=120, verbose=0)
    initial = example.make_estimator(store, seed=SEED).getModel()
    with pytest.raises(ValueError, match="configure_optimizers"):
        TorchEstimator(model=initial, optimizer=torch.optim.SGD(initial.parameters(), lr=0.1), store=store,
                       feature_cols=["x"], label_cols=["label"])._check_common()
    start = time.monotonic()
    fitted = example.main(["--store", path], backend=backend)
    print("lightning example (fit, transform): %.1f s" % (time.monotonic() - start))
    ranks = [cloudpickle.loads(r["model"]) for r in backend.results]
    for a, b in zip(ranks[0].state_dict().values(), ranks[1].state_dict().values(), strict=True):
        assert torch.equal(a, b), "the ranks' weights differ"

    meta = hvd_data.describe(store, 0)
    fs, local = store.get_arrow_filesystem()
    groups = [(local(p), g, n) for p, g, n in meta["train_row_groups"]]
    columns = ["vec", "arr", "x", "label"]
    steps = steps_per_epoch(groups, 2, 32)
    optimizer = torch.optim.SGD(initial.parameters(), lr=0.1, momentum=0.9)
    readers = [BatchReader(groups, fs, columns, meta["kinds"], 32, r, 2, steps=steps, seed=SEED) for r in range(2)]
    for epoch in range(3):
        for b0, b1 in zip(readers[0].epoch(epoch), readers[1].epoch(epoch), strict=True):
            optimizer.zero_grad()
            loss = 0
            for batch in (b0, b1):
                inputs = [torch.from_numpy(batch[c].astype(np.float32)) for c in ("vec", "arr", "x")]
                loss = loss + torch.nn.functional.cross_entropy(initial(*inputs), torch.from_numpy(batch["label"])) / 2
            loss.backward()
            optimizer.step()
    worst = max(float((a - b).abs().max()) for a, b in
                zip(ranks[0].state_dict().values(), initial.state_dict().values(), strict=True))
    print("lightning: largest weight difference to the single-process run: %.3g" % worst)
    assert worst < 1e-5
    history = fitted.getHistory()
    print("lightning history:", history)
    assert len(history["val_accuracy"]) == 3 and history["val_accuracy"][-1] >= 0.95

    rows = fitted.transform(frame).orderBy("id").select("label", "label__output").collect()
    assert len(rows) == ROWS
    accuracy = np.mean([np.argmax(r["label__output"]) == r["label"] for r in rows])
    print("lightning transform accuracy: %.4f" % accuracy)
    assert accuracy >= 0.95


def test_torch_example_as_a_script_on_local_master(tmp_path):
    """docs/examples/spark/estimator_torch.py as a user runs it, on a ``local[2]`` master of its
    own (a separate driver process; its Spark folders under tmp_path)."""
    import subprocess

    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_DIRS=str(tmp_path / "local"), TMPDIR=str(tmp_path / "tmp"),
               JAVA_TOOL_OPTIONS="-XX:-UsePerfData -Djava.io.tmpdir=%s" % (tmp_path / "tmp"))
    start = time.monotonic()
    out = subprocess.run([sys.executable, str(EXAMPLES / "estimator_torch.py"), "--master", "local[2]",
                          "--num-proc", "2", "--store", str(tmp_path / "store")], env=env, capture_output=True,
                         text=True, timeout=300)
    print("estimator_torch.py on local[2]: %.1f s" % (time.monotonic() - start))
    assert out.returncode == 0, out.stderr[-3000:]
    accuracy = float(out.stdout.split("accuracy on all rows:")[1].split()[0])
    print("local[2] example accuracy on all rows: %.3f" % accuracy)
    assert accuracy >= 0.95
    assert (tmp_path / "store" / "torch-model" / "metadata").is_dir()
