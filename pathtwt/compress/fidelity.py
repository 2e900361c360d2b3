"""Held-out fidelity of a compressed backbone to its teacher.

The number that matters downstream is the tile embedding (concat of CLS and mean patch
token, ``pathtwt.models.embedding.pool_tokens``), so fidelity is the cosine between student and
teacher embeddings of held-out calibration tiles; per-block MSE at the block boundaries
says where a student drifts.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from pathtwt.compress.distill import Transform
from pathtwt.compress.intermediates import tiles_to_batch
from pathtwt.compress.student import block_outputs


@torch.no_grad()
def evaluate_fidelity(
    student: nn.Module,
    teacher: nn.Module,
    tiles: np.ndarray,
    *,
    transform: Transform,
    num_prefix_tokens: int,
    boundaries: Sequence[int] | None = None,
    device: str = "cpu",
    batch_size: int = 32,
) -> dict[str, object]:
    """Embedding cosine (mean, min) on ``tiles``; with ``boundaries`` (teacher layer e_j matched
    by student block j) also the per-block MSE and the final-feature MSE."""
    from pathtwt.models.embedding import pool_model_tokens

    if len(tiles) == 0:
        return {"n_tiles": 0}
    student.eval().to(device)
    teacher.eval().to(device)
    cos_parts, block_sums, final_sum = [], None, 0.0
    for i in range(0, len(tiles), batch_size):
        x = tiles_to_batch(transform, tiles[i : i + batch_size], device)
        s_out, t_out = block_outputs(student, x), block_outputs(teacher, x)
        s_final, t_final = student.norm(s_out[-1]), teacher.norm(t_out[-1])
        cos = nn.functional.cosine_similarity(pool_model_tokens(student, s_final, num_prefix_tokens),
                                              pool_model_tokens(teacher, t_final, num_prefix_tokens), dim=-1)
        cos_parts.append(cos.cpu())
        n = x.shape[0]
        final_sum += float(nn.functional.mse_loss(s_final, t_final)) * n
        if boundaries is not None:
            mses = [float(nn.functional.mse_loss(s_out[j + 1], t_out[e])) * n for j, e in enumerate(boundaries)]
            block_sums = mses if block_sums is None else [a + b for a, b in zip(block_sums, mses)]
    cos_all = torch.cat(cos_parts)
    n_tiles = len(tiles)
    result: dict[str, object] = {
        "n_tiles": n_tiles,
        "embedding_cosine_mean": float(cos_all.mean()),
        "embedding_cosine_min": float(cos_all.min()),
        "final_mse": final_sum / n_tiles,
    }
    if block_sums is not None:
        result["block_mse"] = [v / n_tiles for v in block_sums]
    return result
