"""Train a Lightning module on a Spark DataFrame with horovod.spark.lightning.TorchEstimator.

The module brings its own ``training_step``, ``validation_step`` and ``configure_optimizers``;
each rank runs ``lightning.Trainer`` with ``horovod.lightning.HorovodStrategy``. A batch is a dict
of column name -> tensor. The data is estimator_data.py's, with 20% held out for validation; the
fitted TorchModel appends ``label__output`` (the two logits).

    python docs/examples/spark/estimator_lightning.py --master spark://HOST:7077 --num-proc 2 \\
        --store /shared/path/hvd-store
"""

import argparse

import lightning
import numpy as np
import torch
from estimator_data import make_dataframe
from pyspark.sql import SparkSession

from horovod.spark.common.store import Store
from horovod.spark.lightning import TorchEstimator


class LitNet(lightning.LightningModule):
    def __init__(self, lr=0.1):
        super().__init__()
        self.lr = lr
        self.hidden = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 2)

    def forward(self, vec, arr, x):
        return self.out(torch.relu(self.hidden(torch.cat([vec, arr, x.unsqueeze(1)], dim=1))))

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.cross_entropy(self(batch["vec"], batch["arr"], batch["x"]), batch["label"])
        self.log("train_loss", loss, on_epoch=True, on_step=False, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        output = self(batch["vec"], batch["arr"], batch["x"])
        self.log("val_accuracy", (output.argmax(dim=1) == batch["label"]).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def make_estimator(store, num_proc=None, backend=None, epochs=3, seed=7, run_id=None):
    torch.manual_seed(seed)
    return TorchEstimator(num_proc=num_proc, backend=backend, store=store, model=LitNet(),
                          feature_cols=["vec", "arr", "x"], label_cols=["label"], validation=0.2, batch_size=32,
                          epochs=epochs, random_seed=seed, run_id=run_id, verbose=0)


def main(argv=None, backend=None):
    """Fit, print the accuracies, transform and save; returns the fitted model. ``backend``
    (a horovod.spark.common.backend.Backend) replaces ``--num-proc`` when given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", required=True, help="a folder (or fsspec URL) every executor can reach")
    args = parser.parse_args(argv)

    spark = SparkSession.builder.master(args.master).appName("estimator_lightning").getOrCreate()
    df = make_dataframe(spark)
    model = make_estimator(Store.create(args.store), num_proc=None if backend else args.num_proc,
                           backend=backend).fit(df)
    print("validation accuracy per epoch:", model.getHistory()["val_accuracy"])

    predictions = model.transform(df).select("label", "label__output").collect()
    correct = np.mean([np.argmax(r["label__output"]) == r["label"] for r in predictions])
    print("accuracy on all rows: %.3f" % correct)
    return model


if __name__ == "__main__":
    main()
