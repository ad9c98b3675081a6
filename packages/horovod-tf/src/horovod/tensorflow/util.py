"""Small helpers shared by horovod.tensorflow's modules."""

import tensorflow as tf

from horovod.common.util import _cache  # noqa: F401 (hvd._cache)


def _executing_eagerly():
    """Whether TensorFlow runs eagerly here (False while a tf.function is traced)."""
    return tf.executing_eagerly()


def _make_subgraph(f):
    """``f`` wrapped in ``tf.function`` (autograph off), so that eager callers run it as one graph."""
    return tf.function(f, autograph=False)


def _ref(variable):
    """A hashable key of a variable or tensor: ``ref()`` of the tf.Variable (a Keras 3 variable
    stands for the tf.Variable it wraps)."""
    if isinstance(variable, tf.Variable):
        return variable.ref()
    inner = getattr(variable, 'value', None)
    if isinstance(inner, tf.Variable):
        return inner.ref()
    return variable.ref() if hasattr(variable, 'ref') else id(variable)


def vars_to_refs(variables):
    """Hashable references of a list of variables (``var.ref()``), for use as dict keys."""
    if isinstance(variables, tuple):
        return tuple(v.ref() for v in variables)
    return [v.ref() for v in variables]


def refs_to_vars(refs):
    """The variables behind references made by ``vars_to_refs``.

    Args:
        refs: a list or tuple of ``ref()`` references of ``tf.Variable`` objects.

    Returns:
        The variables, as a tuple for a tuple and a list otherwise.
    """
    if isinstance(refs, tuple):
        return tuple(r.deref() for r in refs)
    return [r.deref() for r in refs]


def _no_autograph(f):
    """Marks a library function so that AutoGraph calls it as it is instead of converting it when
    a ``tf.function`` calls it: conversion would only cost tracing time, since these functions
    build their graph with Python control flow on trace-time values on purpose."""
    return tf.autograph.experimental.do_not_convert(f)
