"""The paper's analyses: norm growth, eps sensitivity, intrinsic dimension and its
stability under augmentation, with figures for the report."""
