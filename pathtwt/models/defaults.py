"""The defaults of running a frozen backbone over tiles that every entry point reads
(the --batch-size of extract, probe, discover and analyze): written here once."""

FORWARD_BATCH_SIZE = 32  # tiles per forward pass
