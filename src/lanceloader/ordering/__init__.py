"""Ordering: pure maths of orders, plans and interleaves (no I/O)."""
