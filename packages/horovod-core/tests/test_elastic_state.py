"""horovod.common.elastic: ObjectState snapshots, host-update agreement and run_fn retries,
in one process with a fake broadcast."""

import pytest

from horovod.common import elastic
from horovod.common.elastic import HostUpdateResult, ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt


class FakeBroadcast:
    """Records broadcast objects; returns ``root_value`` when set (what rank 0 would send)."""

    def __init__(self):
        self.calls = []
        self.root_value = None

    def __call__(self, obj):
        self.calls.append(obj)
        return obj if self.root_value is None else self.root_value


def make_state(**kwargs):
    bcast = FakeBroadcast()
    return ObjectState(bcast, lambda: 0, **kwargs), bcast


def test_kwargs_become_attributes_and_restore_rolls_back():
    state, _ = make_state(epoch=1, batch=5)
    assert (state.epoch, state.batch) == (1, 5)
    state.epoch, state.batch = 2, 0
    state.restore()
    assert (state.epoch, state.batch) == (1, 5)
    state.epoch = 3
    state.save()
    state.epoch = 4
    state.restore()
    assert state.epoch == 3


def test_sync_applies_root_snapshot():
    state, bcast = make_state(epoch=1)
    bcast.root_value = {'epoch': 7}
    state.sync()
    assert state.epoch == 7
    assert bcast.calls == [{'epoch': 1}]
    state.epoch = 8
    state.restore()
    assert state.epoch == 7


def test_sync_of_empty_state_broadcasts_nothing():
    state, bcast = make_state()
    state.sync()
    assert bcast.calls == []


def test_abstract_state_methods():
    state = elastic.State(FakeBroadcast(), lambda: 0)
    for method in (state.save, state.restore, state.sync):
        with pytest.raises(NotImplementedError):
            method()
    state.reset()


def test_no_update_commits_quietly():
    state, bcast = make_state(step=0)
    state.step = 1
    state.commit()
    assert bcast.calls == [(0, 0, HostUpdateResult.no_update)]
    state.step = 2
    state.restore()
    assert state.step == 1


@pytest.mark.parametrize('updates, skip_sync', [
    ([HostUpdateResult.removed], True),
    ([HostUpdateResult.added], False),
    ([HostUpdateResult.removed, HostUpdateResult.added], False),
])
def test_host_updates_interrupt(updates, skip_sync):
    state, bcast = make_state()
    for i, res in enumerate(updates):
        state.on_hosts_updated(10 + i, res)
    with pytest.raises(HostsUpdatedInterrupt) as info:
        state.check_host_updates()
    assert info.value.skip_sync is skip_sync
    assert state._last_updated_timestamp == 9 + len(updates)
    assert state._host_messages.empty()
    state.check_host_updates()  # already handled: no second interrupt


def test_stale_updates_are_ignored():
    state, _ = make_state()
    state._last_updated_timestamp = 20
    state.on_hosts_updated(15, HostUpdateResult.added)
    state.check_host_updates()
    assert state._last_updated_timestamp == 20


def test_rank0_decision_wins():
    # This rank saw nothing, but rank 0 saw an added host: every rank must interrupt.
    state, bcast = make_state()
    bcast.root_value = (0, 5, HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt) as info:
        state.check_host_updates()
    assert not info.value.skip_sync
    assert state._last_updated_timestamp == 5


def test_on_reset_clears_queue_and_runs_callbacks():
    state, _ = make_state()
    calls = []
    state.register_reset_callbacks([lambda: calls.append('a'), lambda: calls.append('b')])
    state.on_hosts_updated(1, HostUpdateResult.added)
    state.on_reset()
    assert calls == ['a', 'b']
    assert state._host_messages.empty()


class RecordingState(ObjectState):
    def __init__(self):
        super().__init__(FakeBroadcast(), lambda: 0, step=0)
        self.events = []

    def sync(self):
        self.events.append('sync')
        super().sync()

    def restore(self):
        self.events.append('restore')
        super().restore()

    def reset(self):
        self.events.append('reset')


def test_run_fn_restores_and_retries_after_internal_error():
    resets = []
    attempts = []

    def train(state, increment):
        attempts.append(state.step)
        state.step += increment
        if len(attempts) == 1:
            raise HorovodInternalError('peer lost')
        return state.step

    state = RecordingState()
    assert run_fn(train, lambda: resets.append(1))(state, 3) == 3
    assert attempts == [0, 0]  # the failed attempt's change was rolled back
    assert resets == [1]
    assert state.events == ['sync', 'restore', 'reset', 'sync']


def test_run_fn_recovers_from_a_peer_lost_during_the_sync():
    # The broadcast of rank 0's state after a reset fails when a peer dies meanwhile: the worker
    # restores, resets and syncs again instead of exiting.
    syncs = []

    class FailingSyncState(RecordingState):
        def sync(self):
            syncs.append(1)
            if len(syncs) == 2:
                self.events.append('sync failed')
                raise HorovodInternalError('peer lost during the broadcast')
            super().sync()

    def train(state):
        if len(syncs) == 1:
            raise HostsUpdatedInterrupt(skip_sync=False)
        return 'done'

    resets = []
    state = FailingSyncState()
    assert run_fn(train, lambda: resets.append(1))(state) == 'done'
    assert resets == [1, 1]
    assert state.events == ['sync', 'reset', 'sync failed', 'restore', 'reset', 'sync']


def test_run_fn_skips_sync_when_hosts_were_only_removed():
    outcomes = [HostsUpdatedInterrupt(skip_sync=True), HostsUpdatedInterrupt(skip_sync=False), None]

    def train(state):
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return 'done'

    state = RecordingState()
    assert run_fn(train, lambda: None)(state) == 'done'
    assert state.events == ['sync', 'reset', 'reset', 'sync']


def test_run_fn_propagates_other_errors_and_removes_listener():
    registered = []

    class Manager:
        def init(self):
            pass

        def register_listener(self, listener):
            registered.append(listener)

        def remove_listener(self, listener):
            registered.remove(listener)

    def train(state):
        assert registered == [state]
        raise ValueError('bad input')

    original = elastic.notification_manager
    elastic.notification_manager = Manager()
    try:
        with pytest.raises(ValueError):
            run_fn(train, lambda: None)(RecordingState())
    finally:
        elastic.notification_manager = original
    assert registered == []
