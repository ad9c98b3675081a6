"""The DataFrame of the Estimator examples (estimator_torch.py, estimator_keras.py,
estimator_lightning.py): a vector column with dense and sparse rows, an array column, a scalar
column and a label that a small model learns."""

import numpy as np
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql import types as T

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("vec", VectorUDT()),
                       T.StructField("arr", T.ArrayType(T.DoubleType())), T.StructField("x", T.DoubleType()),
                       T.StructField("label", T.LongType()), T.StructField("is_val", T.BooleanType())])


def make_dataframe(spark, rows=3000, seed=0):
    """A DataFrame of ``rows`` rows: id, vec (4 elements, odd rows sparse), arr (3), x, label
    (1 when a weighted sum of the features is positive) and is_val (every fifth row)."""
    rng = np.random.default_rng(seed)
    vec = rng.normal(size=(rows, 4))
    vec[rng.random((rows, 4)) < 0.3] = 0.0
    arr = rng.normal(size=(rows, 3))
    x = rng.normal(size=rows)
    label = (vec @ [1.0, -1.0, 0.5, 1.5] + arr @ [1.0, 0.5, -1.0] + 0.8 * x > 0).astype(int)
    data = []
    for i in range(rows):
        v = (Vectors.sparse(4, {j: float(vec[i, j]) for j in range(4) if vec[i, j] != 0.0}) if i % 2
             else Vectors.dense(vec[i].tolist()))
        data.append((i, v, arr[i].tolist(), float(x[i]), int(label[i]), i % 5 == 0))
    return spark.createDataFrame(data, SCHEMA).repartition(4)
