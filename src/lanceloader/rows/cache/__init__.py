"""The cache of Lance rows: pieces of the pinned version on local disk or in memory."""
