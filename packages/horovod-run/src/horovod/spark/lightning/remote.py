"""The function each rank of a Lightning ``TorchEstimator`` fit runs: the rank's readers as
iterable datasets, ``lightning.Trainer`` with ``HorovodStrategy``, a callback that records the
history and writes the checkpoint on rank 0, and the restore of the run's last checkpoint."""

import io

import cloudpickle

from horovod.spark.common.remote import to_bytes


def trainer(spec, settings):
    """The rank function of one fit; returns on every rank ``{"model": cloudpickled module,
    "history": {name: [value per epoch]}, "start_epoch": int}``."""

    def train():
        import lightning
        import torch

        import horovod.torch as hvd
        from horovod.lightning import HorovodStrategy
        from horovod.spark.torch.remote import to_tensors

        hvd.init()
        torch.set_num_threads(1)
        rank, size = hvd.rank(), hvd.size()
        model = cloudpickle.loads(settings["model"])
        history, start_epoch, optimizer_state = {}, 0, None
        saved = spec.load_checkpoint()
        if saved is not None:
            state = torch.load(io.BytesIO(saved), weights_only=False)
            model.load_state_dict(state["model"])
            optimizer_state = state["optimizer"]
            history, start_epoch = state["history"], state["epoch"] + 1
        train_reader, val_reader = spec.readers(rank, size)
        if settings["prefetch"]:
            train_reader.prefetch = settings["prefetch"]
        columns = spec.columns
        shapes = [None] * len(columns)
        for i, shape in enumerate(settings["input_shapes"] or []):
            shapes[i] = shape

        class Batches(torch.utils.data.IterableDataset):
            """One epoch of the reader per ``iter``, epochs counted from the first one run."""

            def __init__(self, reader):
                self.reader, self.epoch = reader, start_epoch

            def __iter__(self):
                epoch, self.epoch = self.epoch, self.epoch + 1
                for batch in self.reader.epoch(epoch):
                    yield dict(zip(columns, to_tensors(batch, columns, shapes), strict=True))

        class Record(lightning.Callback):
            def on_train_start(self, trainer, module):
                if optimizer_state is not None:
                    trainer.optimizers[0].load_state_dict(optimizer_state)

            def on_train_epoch_end(self, trainer, module):
                for key, value in trainer.callback_metrics.items():
                    history.setdefault(key, []).append(float(value))
                if rank == 0:
                    spec.save_checkpoint(to_bytes(torch.save, {
                        "model": module.state_dict(), "optimizer": trainer.optimizers[0].state_dict(),
                        "history": history, "epoch": trainer.current_epoch}))

        use_gpu = settings["use_gpu"] and torch.cuda.is_available()
        args = dict(accelerator="gpu" if use_gpu else "cpu", devices=1,
                    strategy=HorovodStrategy(compression=settings["compression"] or hvd.Compression.none),
                    max_epochs=spec.epochs - start_epoch, limit_train_batches=spec.steps(size),
                    num_sanity_val_steps=0, logger=settings["logger"] or False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    log_every_n_steps=settings["log_every_n_steps"], detect_anomaly=settings["detect_anomaly"],
                    profiler=settings["profiler"],
                    callbacks=[*cloudpickle.loads(settings["callbacks"]), Record()])
        if spec.validation_steps_per_epoch:
            args["limit_val_batches"] = spec.validation_steps_per_epoch
        args.update(settings["trainer_args"])
        loader = torch.utils.data.DataLoader(Batches(train_reader), batch_size=None)
        val_loader = torch.utils.data.DataLoader(Batches(val_reader), batch_size=None) if val_reader else None
        if start_epoch < spec.epochs:
            lightning.Trainer(**args).fit(model, loader, val_loader)
        model.to("cpu")
        result = {"model": cloudpickle.dumps(model), "history": history, "start_epoch": start_epoch}
        hvd.shutdown()
        return result

    return train
