"""Small runner utilities: env export filter, rank/size from env, secret digests, codec, timeout."""

import time

import pytest

from horovod.runner.common.util import codec, env, secret, timeout


def test_is_exportable():
    for name in ("BASH_FUNC_module%%", "OLDPWD", "CUDA_VISIBLE_DEVICES",
                 "NVIDIA_CUDA_VISIBLE_DEVICES", "_HOROVOD_SECRET_KEY"):
        assert not env.is_exportable(name), name
    for name in ("PATH", "PYTHONPATH", "HOROVOD_FUSION_THRESHOLD", "MY_OLDPWD"):
        assert env.is_exportable(name), name


@pytest.mark.parametrize("variables,expected", [
    ({}, (0, 1)),
    ({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "PMI_RANK": "0", "PMI_SIZE": "1"}, (2, 4)),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3"}, (1, 3)),
    ({"PMI_RANK": "5", "PMI_SIZE": "6"}, (5, 6)),
])
def test_get_env_rank_and_size(monkeypatch, variables, expected):
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert env.get_env_rank_and_size() == expected


def test_get_env_rank_without_size(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.delenv("HOROVOD_SIZE", raising=False)
    with pytest.raises(RuntimeError, match="HOROVOD_SIZE"):
        env.get_env_rank_and_size()


def test_secret_digests():
    key = secret.make_secret_key()
    assert len(key) == secret.SECRET_LENGTH == 32
    digest = secret.compute_digest(key, b"message")
    assert len(digest) == secret.DIGEST_LENGTH
    assert secret.check_digest(key, b"message", digest)
    assert not secret.check_digest(key, b"messagE", digest)
    assert not secret.check_digest(secret.make_secret_key(), b"message", digest)
    assert secret.HOROVOD_SECRET_KEY == "_HOROVOD_SECRET_KEY"


def test_codec_round_trip():
    offset = 3
    encoded = codec.dumps_base64(lambda x: x + offset)
    assert isinstance(encoded, str)
    assert codec.loads_base64(encoded)(1) == 4
    assert codec.loads_base64(codec.dumps_base64({"a": [1]}, to_ascii=False)) == {"a": [1]}


def test_timeout():
    deadline = timeout.Timeout(0.2, message="Timed out waiting for {activity}.")
    assert not deadline.timed_out() and 0 < deadline.remaining() <= 0.2
    deadline.check_time_out_for("nothing")
    time.sleep(0.3)
    assert deadline.timed_out() and deadline.remaining() == 0
    with pytest.raises(timeout.TimeoutException, match="^Timed out waiting for the hosts.$"):
        deadline.check_time_out_for("the hosts")
