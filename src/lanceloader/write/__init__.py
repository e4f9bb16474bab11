"""Data in: convert, materialize and the demo dataset."""
