"""Hugging Face ``Dinov2WithRegisters`` (Hibou-B's published layout) -> timm ViT weights.

A pure ``state_dict -> state_dict`` function. Both Hugging Face layouts are accepted:
the published one (``attention.attention.query``, ``mlp.weights_in``) and the one
transformers >= 5 produces in memory (``attention.q_proj``, ``mlp.gate_proj/up_proj``).

Token layout: Hugging Face adds position embeddings to [CLS, patches] and inserts the
registers after CLS without position embeddings. timm's ``no_embed_class`` ViT adds
position embeddings to patches only, so the CLS position embedding is folded into the
class token (cls + pos[0]); timm then yields the same [CLS, registers, patches]
sequence. Position embeddings stored at another grid are resampled the way Hugging
Face does at run time (bicubic, antialiased, float32), so outputs match at our input size.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

SENTINEL = "embeddings.patch_embeddings.projection.weight"
_PREFIXES = ("dinov2_with_registers.", "dinov2.", "model.", "backbone.")
# Heads of classification checkpoints are not backbone weights.
_DROPPED = ("classifier.", "embeddings.mask_token")

_LAYER_RENAMES = (
    ("norm1.", "norm1."),
    ("norm2.", "norm2."),
    ("attention.output.dense.", "attn.proj."),
    ("attention.o_proj.", "attn.proj."),
    ("layer_scale1.lambda1", "ls1.gamma"),
    ("layer_scale2.lambda1", "ls2.gamma"),
    ("mlp.weights_in.", "mlp.fc1."),
    ("mlp.weights_out.", "mlp.fc2."),
    ("mlp.down_proj.", "mlp.fc2."),
    ("mlp.fc1.", "mlp.fc1."),
    ("mlp.fc2.", "mlp.fc2."),
)
_QKV = {
    "q": ("attention.attention.query.", "attention.q_proj."),
    "k": ("attention.attention.key.", "attention.k_proj."),
    "v": ("attention.attention.value.", "attention.v_proj."),
}
_LAYER_RE = re.compile(r"^encoder\.layer\.(\d+)\.(.*)$")


def _strip(key: str) -> str:
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def is_hf_dinov2_layout(state: Mapping[str, Any]) -> bool:
    return any(_strip(k) == SENTINEL for k in state)


def hf_dinov2_to_timm(
    state: Mapping[str, Any], grid: tuple[int, int], no_embed_class: bool = True
) -> dict[str, Any]:
    """Convert a Hugging Face DINOv2(-with-registers) state dict to timm names.

    ``grid`` is the timm model's patch grid (rows, cols); ``no_embed_class`` is True for
    timm's register models (position embeddings on patches only).
    """
    import torch

    src = {_strip(k): v for k, v in state.items() if not _strip(k).startswith(_DROPPED)}
    out: dict[str, Any] = {}
    layers: dict[int, dict[str, Any]] = {}
    unknown = []
    for key, value in src.items():
        m = _LAYER_RE.match(key)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = value
        elif key in ("embeddings.cls_token", "embeddings.position_embeddings", "embeddings.register_tokens"):
            continue  # handled together below
        elif key.startswith("embeddings.patch_embeddings.projection."):
            out["patch_embed.proj." + key.rsplit(".", 1)[1]] = value
        elif key.startswith("layernorm."):
            out["norm." + key.rsplit(".", 1)[1]] = value
        else:
            unknown.append(key)

    cls = src["embeddings.cls_token"]
    pos = src["embeddings.position_embeddings"]
    patch_pos = _resample_patch_pos(pos[:, 1:], grid)
    if no_embed_class:
        out["cls_token"] = cls + pos[:, :1]
        out["pos_embed"] = patch_pos
    else:
        out["cls_token"] = cls
        out["pos_embed"] = torch.cat([pos[:, :1], patch_pos], dim=1)
    if "embeddings.register_tokens" in src:
        out["reg_token"] = src["embeddings.register_tokens"]

    for index, params in sorted(layers.items()):
        out.update(_convert_layer(index, params, unknown))
    # Keys we do not understand are passed through under their own names, so the strict
    # loader names them instead of them vanishing.
    for key in unknown:
        out[key] = src[key]
    return out


def _convert_layer(index: int, params: Mapping[str, Any], unknown: list[str]) -> dict[str, Any]:
    import torch

    prefix = f"blocks.{index}."
    out: dict[str, Any] = {}
    qkv: dict[str, dict[str, Any]] = {"weight": {}, "bias": {}}
    gate_up: dict[str, dict[str, Any]] = {"weight": {}, "bias": {}}
    for key, value in params.items():
        kind = key.rsplit(".", 1)[-1]
        hit = next((n for n, names in _QKV.items() if key.startswith(names)), None)
        if hit is not None:
            qkv[kind][hit] = value
            continue
        if key.startswith("mlp.gate_proj.") or key.startswith("mlp.up_proj."):
            gate_up[kind]["gate" if key.startswith("mlp.gate_proj.") else "up"] = value
            continue
        rename = next(((a, b) for a, b in _LAYER_RENAMES if key.startswith(a)), None)
        if rename is None:
            unknown.append(f"encoder.layer.{index}.{key}")
            continue
        out[prefix + rename[1] + key[len(rename[0]):]] = value
    for kind, parts in qkv.items():
        if parts:
            out[prefix + f"attn.qkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    for kind, parts in gate_up.items():
        if parts:
            # timm's SwiGLUPacked computes act(first half) * second half, as Hugging Face's
            # silu(gate) * up: the gate goes first.
            out[prefix + f"mlp.fc1.{kind}"] = torch.cat([parts["gate"], parts["up"]], dim=0)
    return out


def _resample_patch_pos(patch_pos: Any, grid: tuple[int, int]) -> Any:
    """(1, side * side, D) patch position embeddings -> (1, grid[0] * grid[1], D) with timm's
    resampler: float32 bicubic with antialiasing, the interpolation Hugging Face's
    Dinov2 applies at run time."""
    import math

    from timm.layers import resample_abs_pos_embed

    side = int(round(math.sqrt(patch_pos.shape[1])))
    if (side, side) == tuple(grid):
        return patch_pos
    return resample_abs_pos_embed(
        patch_pos, new_size=list(grid), old_size=[side, side], num_prefix_tokens=0,
        interpolation="bicubic", antialias=True,
    )
