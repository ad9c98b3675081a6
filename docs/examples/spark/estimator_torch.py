"""Train a PyTorch model on a Spark DataFrame with horovod.spark.torch.TorchEstimator.

The DataFrame has a vector column (dense and sparse rows), an array column and a scalar column;
the label follows a linear rule of them. 20% of the rows are held out for validation. The fitted
TorchModel appends a ``label__output`` column (the two logits) to any DataFrame with the feature
columns, and saves and loads as a Spark ML stage.

    python docs/examples/spark/estimator_torch.py --master spark://HOST:7077 --num-proc 2 \\
        --store /shared/path/hvd-store
"""

import argparse

import numpy as np
import torch
from estimator_data import make_dataframe
from pyspark.sql import SparkSession

from horovod.spark.common.store import Store
from horovod.spark.torch import TorchEstimator, TorchModel

class Net(torch.nn.Module):
    """Takes the feature columns in order: vec (batch, 4), arr (batch, 3), x (batch,)."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 2)

    def forward(self, vec, arr, x):
        return self.out(torch.relu(self.hidden(torch.cat([vec, arr, x.unsqueeze(1)], dim=1))))


def accuracy(output, label):
    return float((output.argmax(dim=1) == label).float().mean())


def make_estimator(store, num_proc=None, backend=None, epochs=4, seed=7, run_id=None, callbacks=()):
    torch.manual_seed(seed)
    model = Net()
    return TorchEstimator(num_proc=num_proc, backend=backend, store=store, model=model,
                          optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                          loss=torch.nn.functional.cross_entropy, metrics=[accuracy],
                          feature_cols=["vec", "arr", "x"], label_cols=["label"], validation=0.2,
                          batch_size=32, epochs=epochs, random_seed=seed, run_id=run_id,
                          callbacks=list(callbacks), verbose=0)


def main(argv=None, backend=None):
    """Fit, print the accuracies, transform and save; returns the fitted model. ``backend``
    (a horovod.spark.common.backend.Backend) replaces ``--num-proc`` when given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", required=True, help="a folder (or fsspec URL) every executor can reach")
    args = parser.parse_args(argv)

    spark = SparkSession.builder.master(args.master).appName("estimator_torch").getOrCreate()
    df = make_dataframe(spark)
    estimator = make_estimator(Store.create(args.store), num_proc=None if backend else args.num_proc,
                               backend=backend)
    model = estimator.fit(df)
    print("validation accuracy per epoch:", model.getHistory()["val_accuracy"])

    predictions = model.transform(df).select("label", "label__output").collect()
    correct = np.mean([np.argmax(r["label__output"]) == r["label"] for r in predictions])
    print("accuracy on all rows: %.3f" % correct)
    model.write().overwrite().save(args.store.rstrip("/") + "/torch-model")
    loaded = TorchModel.load(args.store.rstrip("/") + "/torch-model")
    print("loaded; its history has %d epochs" % len(loaded.getHistory()["loss"]))
    return model


if __name__ == "__main__":
    main()
