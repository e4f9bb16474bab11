"""Clips: video clips and audio windows, views of Lance rows whose samples are clips."""
