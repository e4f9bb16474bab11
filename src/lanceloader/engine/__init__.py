"""Execution: the stream, the worker's job, thread and process pools, stats."""
