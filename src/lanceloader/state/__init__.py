"""State: the cursor and the checkpoint format."""
