"""Hugging Face DINOv2-with-registers key layouts for the checkpoint tests."""

from __future__ import annotations

import torch

# transformers >= 5 in-memory names -> the names the published checkpoints (Hibou, ...) use
_PUBLISHED_RENAMES = (
    ("attention.q_proj", "attention.attention.query"), ("attention.k_proj", "attention.attention.key"),
    ("attention.v_proj", "attention.attention.value"), ("attention.o_proj", "attention.output.dense"),
    ("mlp.down_proj", "mlp.weights_out"),
)


def published_layout(state: dict) -> dict:
    """A state dict under the published key names (transformers < 5): split q/k/v under
    attention.attention, packed SwiGLU weights_in (gate and up concatenated) / weights_out."""
    out = {}
    for key, value in state.items():
        for a, b in _PUBLISHED_RENAMES:
            key = key.replace(a, b)
        if ".mlp.up_proj." in key:
            continue
        if ".mlp.gate_proj." in key:
            up = state[key.replace("gate_proj", "up_proj")]
            key, value = key.replace("gate_proj", "weights_in"), torch.cat([value, up])
        out[key] = value
    return out


def current_layout(published: dict, current: dict) -> dict:
    """Published names -> the installed transformers' in-memory names, for the keys of
    ``current`` (identity on transformers < 5): the inverse of :func:`published_layout`."""
    out = {}
    for key in current:
        pub = key
        for a, b in _PUBLISHED_RENAMES:
            pub = pub.replace(a, b)
        if ".mlp.gate_proj." in key or ".mlp.up_proj." in key:
            gate, up = published[pub.replace("gate_proj", "weights_in").replace("up_proj", "weights_in")].chunk(2, 0)
            out[key] = gate if "gate_proj" in key else up
        else:
            out[key] = published[pub]
    return out
