"""Elastic training: the worker side of host-change notifications (runner.md §5.5)."""
