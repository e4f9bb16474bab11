"""Rows: what a source of rows is (the protocol) and every kind of rows."""
