"""The function each rank of a ``KerasEstimator`` fit runs: compile the model with Horovod's
distributed optimizer, restore the run's checkpoint, ``model.fit`` on the rank's reader, and
return the weights and the history."""

import pickle

import cloudpickle
import numpy as np

from horovod.spark.common.remote import to_arrays


def trainer(spec, settings):
    """The rank function of one fit; returns on every rank ``{"weights": list of numpy arrays,
    "history": {name: [value per epoch]}, "start_epoch": int}``."""

    def train():
        import keras
        import tensorflow as tf

        import horovod.keras as hvd

        try:  # one thread per rank: the ranks share the host's cores
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:
            pass  # TensorFlow's runtime was started already (by a callback, a transformation)
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        with keras.utils.custom_object_scope(settings["custom_objects"] or {}):
            model = cloudpickle.loads(settings["model"])
        history, start_epoch = {}, 0
        saved = spec.load_checkpoint()
        if saved is not None:
            state = pickle.loads(saved)
            model.set_weights(state["weights"])
            history, start_epoch = state["history"], state["epoch"] + 1
        optimizer_cls, config = settings["optimizer"]
        config = dict(config)
        config["learning_rate"] = float(config["learning_rate"]) * size
        optimizer = hvd.DistributedOptimizer(optimizer_cls.from_config(config),
                                             compression=settings["compression"] or hvd.Compression.none)
        model.compile(optimizer=optimizer, loss=settings["loss"], loss_weights=settings["loss_weights"],
                      metrics=settings["metrics"] or None)
        if saved is not None and state.get("optimizer"):
            # The slots and the iteration count as the checkpoint left them; the learning rate is
            # this run's (scaled by this run's size).
            # Matched by position (names carry per-process counters: sgd_2/dense_2_...).
            optimizer.build(model.trainable_variables)
            if len(optimizer.variables) != len(state["optimizer"]):
                raise ValueError("the checkpoint of run %s holds %d optimizer variables, the optimizer has %d: "
                                 "resume with the optimizer the run started with"
                                 % (spec.run_id, len(state["optimizer"]), len(optimizer.variables)))
            for variable, value in zip(optimizer.variables, state["optimizer"], strict=True):
                if not variable.path.endswith("learning_rate"):
                    variable.assign(value)

        train_reader, val_reader = spec.readers(rank, size)
        steps = spec.steps(size)

        def batches(reader, first):
            for epoch in range(first, spec.epochs):
                for batch in reader.epoch(epoch):
                    x = to_arrays(batch, spec.feature_cols)
                    y = to_arrays(batch, spec.label_cols)
                    item = (x[0] if len(x) == 1 else tuple(x), y[0] if len(y) == 1 else tuple(y))
                    if spec.sample_weight_col:
                        item = item + (to_arrays(batch, [spec.sample_weight_col])[0],)
                    yield item

        class Checkpoint(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                for key, value in (logs or {}).items():
                    history.setdefault(key, []).append(float(value))
                if rank == 0:
                    slots = [np.asarray(v.numpy()) for v in self.model.optimizer.variables]
                    spec.save_checkpoint(pickle.dumps({"weights": self.model.get_weights(), "history": history,
                                                       "epoch": epoch, "optimizer": slots}))

        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                     *cloudpickle.loads(settings["callbacks"]), Checkpoint()]
        fit_args = dict(x=batches(train_reader, start_epoch), steps_per_epoch=steps, epochs=spec.epochs,
                        initial_epoch=start_epoch, callbacks=callbacks, verbose=2 if spec.verbose and rank == 0 else 0,
                        shuffle=False)
        if val_reader is not None and start_epoch < spec.epochs:
            val_batch = spec.val_batch_size or spec.batch_size
            fit_args["validation_data"] = batches(val_reader, start_epoch)
            fit_args["validation_steps"] = spec.validation_steps_per_epoch or max(
                1, -(-val_reader.rows // val_batch))
        if start_epoch < spec.epochs:
            model.fit(**fit_args)
        weights = model.get_weights()
        hvd.shutdown()
        return {"weights": weights, "history": history, "start_epoch": start_epoch}

    return train
