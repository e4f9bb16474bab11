"""Lance rows: one pinned Lance dataset read by position, its blobs, splits and first reads."""
