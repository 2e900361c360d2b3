"""Parameters and multiply-accumulates (MACs) per tile, counted from the model itself.

How MACs are counted (the paper's "GFLOPs" are MACs): for T tokens (prefix + patches),
every ``nn.Linear`` applied to the tokens costs T * in * out; every attention module
adds its two matmuls QK^T and AV, 2 * T^2 * (heads * head_dim); the patch embedding
costs out_ch * in_ch * k_h * k_w per patch; a head applied to one pooled vector costs
in * out. Norms, activations, softmax, biases and the residual additions are not
counted. Blocks are walked in execution order, so a layer whose module is reused k
times (weight sharing) is counted k times, and an attention-free block (its ``attn`` a
pass-through) costs only its MLP. Parameters count unique tensors, so shared weights
count once.

Modules that run once per tile rather than once per token carry ``runs_per_tile = True``
(WDPruning's probe on the pooled embedding, Raptor's layer-index conditioning): their
linear maps cost in * out, whatever the number of tokens.

The paper's tables were counted differently (an operator-level counter over the traced
forward pass); :func:`count_macs` reproduces that counting with ``norms=True`` (every
LayerNorm over the tokens costs 5 MACs per element, as that counter charges them) and
``attention=False`` (the fused attention kernel timm calls is an operator that counter
does not see, so QK^T and AV are missing from the students' rows). docs/method.md, "Cost", lays
the two countings side by side.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def count_params(model: nn.Module) -> int:
    """Number of parameters, each distinct tensor (storage) counted once."""
    seen: set[Any] = set()
    total = 0
    for p in model.parameters():  # already drops repeated Parameter objects
        if p.device.type == "meta":
            key: Any = id(p)
        else:
            key = (p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape), tuple(p.stride()))
        if key in seen:
            continue
        seen.add(key)
        total += p.numel()
    return total


def _grid(model: nn.Module, input_size: int | tuple[int, int] | None) -> tuple[int, int]:
    pe = model.patch_embed
    patch = pe.patch_size if isinstance(pe.patch_size, (tuple, list)) else (pe.patch_size, pe.patch_size)
    if input_size is None:
        return tuple(int(g) for g in pe.grid_size)  # type: ignore[return-value]
    h, w = (input_size, input_size) if isinstance(input_size, int) else input_size
    return h // patch[0], w // patch[1]


def _per_tile_linears(module: nn.Module) -> set[int]:
    return {id(m) for sub in module.modules() if getattr(sub, "runs_per_tile", False)
            for m in sub.modules() if isinstance(m, nn.Linear)}


def _linear_macs(module: nn.Module, tokens: int) -> int:
    once = _per_tile_linears(module)
    return sum((1 if id(m) in once else tokens) * m.in_features * m.out_features
               for m in module.modules() if isinstance(m, nn.Linear))


def _norm_macs(module: nn.Module, tokens: int) -> int:
    """The paper's counter: 5 per normalised element (mean, variance, normalise, scale, shift)."""
    return sum(5 * tokens * int(m.normalized_shape[-1]) for m in module.modules() if isinstance(m, nn.LayerNorm))


def _attention_matmul_macs(module: nn.Module, tokens: int) -> int:
    total = 0
    for m in module.modules():
        heads, head_dim = getattr(m, "num_heads", None), getattr(m, "head_dim", None)
        if heads is not None and head_dim is not None and any(isinstance(c, nn.Linear) for c in m.children()):
            total += 2 * tokens * tokens * int(heads) * int(head_dim)
    return total


def block_macs(block: nn.Module, tokens: int, *, norms: bool = False, attention: bool = True) -> int:
    """MACs of one transformer block over ``tokens`` tokens."""
    macs = _linear_macs(block, tokens)
    if attention:
        macs += _attention_matmul_macs(block, tokens)
    if norms:
        macs += _norm_macs(block, tokens)
    return macs


def count_macs(model: nn.Module, input_size: int | tuple[int, int] | None = None, *, norms: bool = False,
               attention: bool = True) -> int:
    """Analytic MACs for one tile at ``input_size`` (default: the model's own). pathtwt's
    counting is the default; ``norms=True, attention=False`` is the paper's for students
    (see the module docstring)."""
    gh, gw = _grid(model, input_size)
    n_patches = gh * gw
    tokens = n_patches + int(getattr(model, "num_prefix_tokens", 1))
    proj = model.patch_embed.proj
    macs = n_patches * proj.out_channels * proj.in_channels * int(proj.kernel_size[0]) * int(proj.kernel_size[1])
    for block in model.blocks:
        macs += block_macs(block, tokens, norms=norms, attention=attention)
    final_norm = getattr(model, "norm", None)
    if isinstance(final_norm, nn.Module):
        # a linear map inside the final norm runs on every token
        macs += _linear_macs(final_norm, tokens) + (_norm_macs(final_norm, tokens) if norms else 0)
    probe = getattr(model, "embedding_probe", None)
    if isinstance(probe, nn.Module):  # on the pooled embedding: once per tile
        macs += _linear_macs(probe, 1)
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        macs += head.in_features * head.out_features
    return int(macs)


def describe_cost(model: nn.Module, input_size: int | tuple[int, int] | None = None) -> dict[str, Any]:
    params = count_params(model)
    macs = count_macs(model, input_size)
    return {
        "params": params,
        "params_m": round(params / 1e6, 2),
        "macs_per_tile": macs,
        "gmacs_per_tile": round(macs / 1e9, 2),
        "depth": len(model.blocks),
        "counting": "MACs: linear layers + attention QK^T and AV + patch embedding; norms/activations excluded",
    }


def meta_model(spec_name: str, depth: int | None = None) -> nn.Module:
    """A backbone architecture on the meta device: shapes only, no memory, for counting."""
    from pathtwt.models.registry import build_timm_model, get_spec

    return build_timm_model(get_spec(spec_name), depth=depth, device=torch.device("meta"))
