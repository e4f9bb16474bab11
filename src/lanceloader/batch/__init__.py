"""Per-batch work: transforms, decoders and conversion to the output format."""
