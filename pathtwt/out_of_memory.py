"""A GPU out-of-memory error as one line that says which option to lower.

torch raises ``torch.cuda.OutOfMemoryError`` (ROCm builds too, as "HIP out of memory") with
a multi-line message about the caching allocator; what a user needs is the option that
brings the job's memory down, which depends on the command. The command line's handler
(:func:`out_of_memory_line`) and the passes around distillation's steps
(:func:`pathtwt.compress.side_passes.named_out_of_memory`) both say it from here."""

from __future__ import annotations

import sys

from pathtwt.errors import first_line

# command -> what to lower; the commands absent here get the generic advice
ADVICE = {
    "compress": "lower --batch-size and raise --accumulate by the same factor (the optimiser step keeps "
                "batch size x accumulate tiles, so the run trains the same), e.g. --batch-size 16 --accumulate 2 "
                "instead of 32 x 1",
    "extract": "lower --batch-size (tiles per forward pass; the features do not depend on it)",
    "predict": "lower --batch-size (tiles per forward pass; the predictions do not depend on it)",
    "probe": "lower --batch-size (tiles per forward pass; the embeddings do not depend on it)",
    "discover": "lower --batch-size (tiles per forward pass)",
    "analyze": "lower --batch-size (tiles per forward pass) or --n-tiles",
    "train-mil": "lower --max-instances (tiles per training bag) or --hidden-dim, or train on --device cpu",
}
GENERIC = "lower the batch size, or run on --device cpu"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a GPU allocation failure (never imports torch itself: a command
    that has not loaded it cannot have run out of GPU memory)."""
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    # torch before 1.13, allocation failures re-raised as plain RuntimeErrors, and a GPU
    # library's (nvImageCodec, nvJPEG) that reports CUDA's own error in its words
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def failed_allocation(exc: BaseException, limit: int) -> str:
    """What an out-of-memory ``exc`` says failed, in at most ``limit`` characters: the first
    line of torch's message without its account of the memory in use."""
    # torch's first line: "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ..."
    return first_line(exc).split(". Including")[0].split(" Of the allocated")[0][:limit].rstrip(". ")


def out_of_memory_line(command: str, exc: BaseException) -> str:
    """The one line printed for an out-of-memory ``exc`` of ``command``."""
    return f"the GPU ran out of memory ({failed_allocation(exc, 200)}); {ADVICE.get(command, GENERIC)}"
