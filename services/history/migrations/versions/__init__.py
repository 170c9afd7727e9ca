"""One module per schema revision, in order; never edit one that has been released."""
