"""Slide-level multiple-instance learning on frozen tile features: bags read lazily from
HDF5 (``data``), the slide heads by name (``heads``) and their torch modules (``models``), the paper's grading and metastasis
protocols (``protocols``), epoch selection (``selection``), metrics (``metrics``) and the
training loop with resumable checkpoints (``train``)."""
