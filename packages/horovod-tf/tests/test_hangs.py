"""Mistakes that used to hang a job, made through horovod.tensorflow's public API: one name used for
different collectives, and a tensor one rank skips, at np 2 and 3 and on a process set, end with an
error on every rank of the set (a mismatch at negotiation; a deadlock after
HOROVOD_DEADLOCK_TIMEOUT_SECONDS), after which correct collectives work."""

from horovod_testing.hangs import hang_test

test_mistakes_raise_on_every_rank_then_collectives_work = hang_test('horovod.tensorflow')
