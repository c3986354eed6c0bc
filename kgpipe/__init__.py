"""kgpipe."""
