"""The distillation defaults every entry point reads (CLI flags, CompressOptions,
DistillOptions): written here once."""

LR = 3e-4  # peak learning rate (the paper's)
BATCH_SIZE = 32  # global micro-batch, split over the ranks
