"""Base64-encoded cloudpickle, the value format of the launcher's KV store."""

import base64

import cloudpickle


def dumps_base64(obj, to_ascii: bool = True):
    """Pickle ``obj`` with cloudpickle and base64-encode it: ``str`` if ``to_ascii``, else bytes."""
    encoded = base64.b64encode(cloudpickle.dumps(obj))
    return encoded.decode("ascii") if to_ascii else encoded


def loads_base64(encoded):
    """Inverse of :func:`dumps_base64`; ``encoded`` is ``str`` or bytes.

    Only call it on authenticated data: unpickling runs arbitrary code.
    """
    if isinstance(encoded, str):
        encoded = encoded.encode("ascii")
    return cloudpickle.loads(base64.b64decode(encoded))
