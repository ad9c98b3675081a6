"""Train a Keras 3 model (TensorFlow backend) on a Spark DataFrame with
horovod.spark.keras.KerasEstimator.

The data is estimator_data.py's: a vector column (dense and sparse rows), an array column and a
scalar column, with 20% of the rows held out for validation. The model takes one input per
feature column in order. The fitted KerasModel appends ``label__output`` (the two logits).

    python docs/examples/spark/estimator_keras.py --master spark://HOST:7077 --num-proc 2 \\
        --store /shared/path/hvd-store
"""

import argparse

import keras
import numpy as np
from estimator_data import make_dataframe
from pyspark.sql import SparkSession

from horovod.spark.common.store import Store
from horovod.spark.keras import KerasEstimator, KerasModel


def build_model(seed=7):
    keras.utils.set_random_seed(seed)
    vec, arr, x = keras.Input((4,), name="vec"), keras.Input((3,), name="arr"), keras.Input((), name="x")
    features = keras.layers.Concatenate()([vec, arr, keras.layers.Reshape((1,))(x)])
    logits = keras.layers.Dense(2)(keras.layers.Dense(16, activation="relu")(features))
    return keras.Model([vec, arr, x], logits)


def make_estimator(store, num_proc=None, backend=None, epochs=3, seed=7, run_id=None):
    return KerasEstimator(num_proc=num_proc, backend=backend, store=store, model=build_model(seed),
                          optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
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

    spark = SparkSession.builder.master(args.master).appName("estimator_keras").getOrCreate()
    df = make_dataframe(spark)
    model = make_estimator(Store.create(args.store), num_proc=None if backend else args.num_proc,
                           backend=backend).fit(df)
    print("validation accuracy per epoch:", model.getHistory()["val_accuracy"])

    predictions = model.transform(df).select("label", "label__output").collect()
    correct = np.mean([np.argmax(r["label__output"]) == r["label"] for r in predictions])
    print("accuracy on all rows: %.3f" % correct)
    model.write().overwrite().save(args.store.rstrip("/") + "/keras-model")
    loaded = KerasModel.load(args.store.rstrip("/") + "/keras-model")
    print("loaded; its history has %d epochs" % len(loaded.getHistory()["loss"]))
    return model


if __name__ == "__main__":
    main()
