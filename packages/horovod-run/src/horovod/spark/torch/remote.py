"""The function each rank of a ``TorchEstimator`` fit runs: restore or broadcast the model,
train ``epochs`` epochs of equal steps with ``horovod.torch.DistributedOptimizer``, validate,
checkpoint on rank 0, and return the model and its history; and what runs beside it on the
executors: ``to_tensors`` (also ``TorchModel``'s predictor's and the Lightning trainer's) and
``losses``."""

import cloudpickle
import numpy as np

from horovod.spark.common.remote import to_arrays, to_bytes


def trainer(spec, model_and_optimizer, settings):
    """The rank function of one fit (see the module docstring); returns on every rank
    ``{"model_and_optimizer": cloudpickled (model, optimizer) with the learning rate unscaled,
    "history": {name: [value per epoch]}, "start_epoch": the epoch it started at}``."""

    def train():
        import torch

        import horovod.torch as hvd

        hvd.init()
        torch.set_num_threads(1)
        rank, size = hvd.rank(), hvd.size()
        model, optimizer = cloudpickle.loads(model_and_optimizer)
        device = torch.device("cuda", hvd.local_rank()) if settings["use_gpu"] and torch.cuda.is_available() \
            else torch.device("cpu")
        model.to(device)
        loss_fns = losses(settings["loss"], settings["loss_constructors"], len(spec.label_cols))
        weights = settings["loss_weights"] or [1.0] * len(spec.label_cols)
        history, start_epoch = {}, 0
        saved = spec.load_checkpoint()
        if saved is not None:
            import io
            state = torch.load(io.BytesIO(saved), weights_only=False, map_location=device)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            history, start_epoch = state["history"], state["epoch"] + 1
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * size
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        distributed = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=settings["compression"] or hvd.Compression.none,
            backward_passes_per_step=settings["backward_passes_per_step"])

        train_reader, val_reader = spec.readers(rank, size)
        label_shapes = settings["label_shapes"]

        def split(batch):
            inputs = [t.to(device) for t in to_tensors(batch, spec.feature_cols, settings["input_shapes"])]
            labels = [t.to(device) for t in to_tensors(batch, spec.label_cols, label_shapes)]
            sample_weights = (to_tensors(batch, [spec.sample_weight_col])[0].to(device)
                              if spec.sample_weight_col else None)
            return inputs, labels, sample_weights

        def loss_of(outputs, labels, sample_weights):
            total = 0.0
            for fn, weight, output, label in zip(loss_fns, weights, outputs, labels, strict=True):
                value = fn(output, label)
                if sample_weights is not None:
                    value = (value * sample_weights).sum() / sample_weights.sum()
                total = total + weight * value
            return total

        def as_list(outputs):
            return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]

        def metric_values(outputs, labels):
            return [float(m(outputs[0], labels[0])) for m in settings["metrics"]]

        names = [getattr(m, "__name__", "metric%d" % i) for i, m in enumerate(settings["metrics"])]

        def averaged(sums, count, name):
            """Means over every rank's rows: one allreduce of (sums..., count)."""
            totals = hvd.allreduce(torch.tensor(list(sums) + [count], dtype=torch.float64), op=hvd.Sum, name=name)
            return (totals[:-1] / max(float(totals[-1]), 1.0)).tolist()

        def call(hook, *args):
            for callback in settings["callbacks"]:
                fn = getattr(callback, hook, None)
                if fn is not None:
                    fn(*args)

        for epoch in range(start_epoch, spec.epochs):
            call("on_epoch_begin", epoch)
            model.train()
            sums, rows = np.zeros(1 + len(names)), 0
            for step, batch in enumerate(train_reader.epoch(epoch)):
                inputs, labels, sample_weights = split(batch)
                if settings["train_minibatch_fn"] is not None:
                    outputs, loss = settings["train_minibatch_fn"](model, distributed, as_list, loss_of, inputs,
                                                                    labels, sample_weights)
                else:
                    distributed.zero_grad()
                    outputs = as_list(model(*inputs))
                    loss = loss_of(outputs, labels, sample_weights)
                    loss.backward()
                    distributed.step()
                n = len(labels[0])
                sums += n * np.array([float(loss)] + metric_values(as_list(outputs), labels))
                rows += n
                call("on_batch_end", epoch, step, {"loss": float(loss)})
            logs = dict(zip(["loss"] + names, averaged(sums, rows, "spark.torch.train.%d" % epoch), strict=True))
            if val_reader is not None:
                model.eval()
                sums, rows = np.zeros(1 + len(names)), 0
                with torch.no_grad():
                    for batch in val_reader.epoch(epoch):
                        inputs, labels, sample_weights = split(batch)
                        outputs = as_list(model(*inputs))
                        n = len(labels[0])
                        sums += n * np.array([float(loss_of(outputs, labels, sample_weights))]
                                             + metric_values(outputs, labels))
                        rows += n
                values = averaged(sums, rows, "spark.torch.val.%d" % epoch)
                logs.update(zip(["val_loss"] + ["val_" + n for n in names], values, strict=True))
            for key, value in logs.items():
                history.setdefault(key, []).append(value)
            call("on_epoch_end", epoch, logs)
            if rank == 0:
                if spec.verbose:
                    print("epoch %d: %s" % (epoch, ", ".join("%s=%.4f" % kv for kv in logs.items())), flush=True)
                spec.save_checkpoint(to_bytes(torch.save, {
                    "model": model.state_dict(), "optimizer": _unscaled(optimizer.state_dict(), size),
                    "history": history, "epoch": epoch}))
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] / size
        model.to("cpu")
        result = {"model_and_optimizer": cloudpickle.dumps((model, optimizer)), "history": history,
                  "start_epoch": start_epoch}
        hvd.shutdown()
        return result

    return train


def _unscaled(state, size):
    for group in state["param_groups"]:
        group["lr"] = group["lr"] / size
    return state


def to_tensors(batch, columns, shapes=None):
    """The columns of ``batch`` (a dict of numpy arrays) as torch tensors: floating point as
    float32, booleans as float32, integers as int64; reshaped to ``(-1, *shape)`` where
    ``shapes`` (a list aligned with ``columns``) gives one."""
    import torch

    out = []
    for i, value in enumerate(to_arrays(batch, columns)):
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        if shapes is not None and shapes[i] is not None:
            tensor = tensor.reshape(-1, *shapes[i])
        out.append(tensor)
    return out


def losses(loss, loss_constructors, num_labels):
    """The loss function of each label (a list), from ``loss`` (a function or a list of them)
    or ``loss_constructors``; ``ValueError`` when the counts differ from the labels'."""
    if loss_constructors is not None:
        fns = [make() for make in loss_constructors]
    elif isinstance(loss, (list, tuple)):
        fns = list(loss)
    else:
        fns = [loss] * num_labels
    if len(fns) != num_labels:
        raise ValueError("%d loss functions for %d label columns" % (len(fns), num_labels))
    return fns
