"""NOSE-style attention removal (Lin et al., "MLP Can Be A Good Transformer Learner"):
selected layers lose their attention branch, which is diluted into the identity during
training so that their MLP takes over.

Default, as in the paper's tables: attention is removed from EVERY layer; the model keeps
all L layers and becomes an MLP-only ViT (H0-mini: 57.36 M parameters, 14.91 G in the
paper's counting). ``--option keep_attention=K`` keeps attention in K layers (the partial
variant); ``--depth`` is refused, because NOSE does not change the depth.

Form: in an attention-free layer the attention branch is replaced by the identity of the
residual stream, so the layer computes ``x = 2x; x = x + ls2(mlp(norm2(x)))``, NOSE's
``x = 2x + MLP(LN(x))`` (LayerNorm makes LN(2x) = LN(x) up to its epsilon); exported as
``layer_patches: {"attention_free": [...]}`` (0-based block indices,
:mod:`pathtwt.models.layer_patches`).

Selection (only for K > 0). NOSE picks the COMBINATION of attention layers whose removal
has the least interaction with the final output, measured by transfer entropy, and builds
it greedily, one layer at a time, each step conditioned on the layers already removed.
Its entropies are estimated under a Gaussian model of the features. pathtwt follows that
procedure with the Gaussian information the modified network's final embedding keeps about
the teacher's, channel by channel:

    I(S) = -1/2 sum_d log(1 - R^2_d(S)),

where R^2_d(S) is the centred fidelity of channel d of the tile embedding with attention
removed from the set S (for jointly Gaussian variables with residual variance
(1 - R^2) var, -1/2 log(1 - R^2) is the information one carries about the other). Each
greedy step adds the layer whose removal, together with those already chosen, keeps the
most information; the L - K chosen layers lose their attention. Candidates are scored on
the selection tiles (:func:`~pathtwt.compress.methods.common.selection_tiles`), never on
the tiles whose fidelity is reported. This is the closest documented equivalent we can
compute without NOSE's classification head: NOSE conditions on the logits, pathtwt on the
tile embedding the downstream MIL heads see.

Distillation: the whole model is trained against the teacher with a loss at every layer
(TWT's deep-supervision loss with every layer a boundary). During the first
``dilute_fraction`` (default 0.3) of the budget the selected layers' attention branch is
diluted, ``(1 - a) attn_branch(x) + a x`` with ``a = t / T_dilute``; afterwards it is gone.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from pathtwt.compress.method_options import method_option
from pathtwt.errors import ConfigError
from pathtwt.compress.methods.common import embedding_r2, selection_tiles
from pathtwt.compress.fidelity import tile_embeddings
from pathtwt.compress.pipeline import CompressOptions, distill_student, export_variant, report_fidelity, total_steps
from pathtwt.models.variant_layers import DilutedAttentionBlock

if TYPE_CHECKING:
    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.models.registry import Backbone


def gaussian_information(per_channel_r2: torch.Tensor) -> float:
    """-1/2 sum_d log(1 - R^2_d): Gaussian information kept about the teacher's channels."""
    return float(-0.5 * torch.log((1 - per_channel_r2).clamp_min(1e-12)).sum())


def greedy_attention_removal(teacher: Backbone, calib: CalibrationSet, options: CompressOptions, n_remove: int) -> tuple[list[int], str, list[dict[str, Any]]]:
    """NOSE's greedy search over combinations: ``n_remove`` layers (0-based, sorted), the
    split they were chosen on, and one trace entry per step."""
    split, tiles = selection_tiles(calib)
    kwargs = dict(transform=teacher.transform, num_prefix_tokens=teacher.spec.num_prefix_tokens,
                  device=options.distill.device, batch_size=options.forward_batch)
    target = tile_embeddings(teacher.model, tiles, **kwargs)
    probe = copy.deepcopy(teacher.model)
    originals = list(probe.blocks)
    free = {i: make_attention_free_copy(b) for i, b in enumerate(originals)}
    chosen: list[int] = []
    trace: list[dict[str, Any]] = []
    for _ in range(n_remove):
        best: tuple[float, int, float] | None = None
        for cand in range(len(originals)):
            if cand in chosen:
                continue
            for i, b in enumerate(originals):
                probe.blocks[i] = free[i] if i in chosen or i == cand else b
            r2, per_channel = embedding_r2(tile_embeddings(probe, tiles, **kwargs), target)
            info = gaussian_information(per_channel)
            if best is None or info > best[0]:
                best = (info, cand, r2)
        assert best is not None
        chosen.append(best[1])
        trace.append({"removed": sorted(chosen), "added": best[1], "information": round(best[0], 6), "r2": round(best[2], 6)})
    return sorted(chosen), split, trace


def make_attention_free_copy(block: torch.nn.Module) -> torch.nn.Module:
    from pathtwt.models.layer_patches import make_attention_free

    block = copy.deepcopy(block)
    make_attention_free(block)
    return block


class DilutedDeepSupervision:
    """TWT's deep supervision at every layer, moving the dilution coefficient each step.
    Once diluted (a = 1) the selected layers' attention is skipped, so its parameters get
    no gradient from then on."""

    leaves_parameters_unused = True  # DistributedDataParallel looks for them each step

    def __init__(self, blocks: Sequence[DilutedAttentionBlock], dilute_steps: int, num_layers: int) -> None:
        from pathtwt.compress.distill import DeepSupervision

        self.blocks, self.dilute_steps = list(blocks), max(1, int(dilute_steps))
        self.inner = DeepSupervision(boundaries=list(range(1, num_layers + 1)))

    def targets(self, teacher: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        return self.inner.targets(teacher, x)

    def loss(self, student: torch.nn.Module, x: torch.Tensor, targets: list[torch.Tensor], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        a = min(1.0, step / self.dilute_steps)
        for b in self.blocks:
            b.alpha.fill_(a)
        loss, terms = self.inner.loss(student, x, targets, step)
        return loss, {**terms, "dilution": a}


def finish_attention_free(student: torch.nn.Module, chosen: Sequence[int]) -> torch.nn.Module:
    """Replace each diluted wrapper by its block in the exported attention-free form."""
    from pathtwt.models.layer_patches import make_attention_free

    for i in chosen:
        wrapper = student.blocks[i]
        block = wrapper.block if isinstance(wrapper, DilutedAttentionBlock) else wrapper
        make_attention_free(block)
        student.blocks[i] = block
    return student


def compress(teacher: Backbone, calib: CalibrationSet, options: CompressOptions) -> Path | None:
    """Registry entry (``--method nose``): select (K > 0), dilute, distill, export."""
    from pathtwt.compress.methods.truncation import truncated_student
    from pathtwt.compress.ranks import decide

    num_layers = len(teacher.model.blocks)
    if options.depth is not None or options.eps is not None or options.plan is not None:
        raise ConfigError("--method nose keeps every layer and takes no --depth/--eps/--plan; "
                          "use --option keep_attention=K to keep attention in K layers (default 0: removed everywhere)")
    try:
        keep = int(method_option(options.extra, "keep_attention"))
    except (TypeError, ValueError):
        keep = -1
    if not 0 <= keep < num_layers:
        raise ConfigError(f"--option keep_attention={options.extra.get('keep_attention')!r}: must be an integer 0 <= K < {num_layers}")
    if keep == 0:
        chosen, split, trace = list(range(num_layers)), None, []
    else:
        # several ranks: rank 0's choice for all (each rank scores the candidates alone)
        chosen, split, trace = decide("NOSE's attention-free layers",
                                      greedy_attention_removal(teacher, calib, options, num_layers - keep))
    student = truncated_student(teacher, num_layers)  # a trainable copy of the whole teacher
    diluted = [DilutedAttentionBlock(student.blocks[i]) for i in chosen]
    for i, b in zip(chosen, diluted):
        student.blocks[i] = b
    for b in diluted:  # the starting point: attention already removed, nothing trained yet
        b.alpha.fill_(1.0)
    every_layer = list(range(1, num_layers + 1))
    initial = report_fidelity(student, teacher, calib, options, every_layer)
    for b in diluted:
        b.alpha.fill_(0.0)
    dilute_steps = int(float(method_option(options.extra, "dilute_fraction")) * total_steps(options, calib))
    run = distill_student(student, teacher, calib, options, description="nose",
                          objective=DilutedDeepSupervision(diluted, dilute_steps, num_layers))
    if not run.completed:
        return None
    finish_attention_free(student, chosen)
    base = teacher.spec.base_backbone or teacher.spec.name
    return export_variant(
        student, teacher, calib, options, method="nose", run=run, initial=initial, layer_patches={"attention_free": chosen},
        selection_split=split, name=f"{base}/nose" if keep == 0 else f"{base}/nose-keep{keep}",
        extra={"attention_layers": keep, "attention_free_layers": [i + 1 for i in chosen],
               "criterion": None if keep == 0 else "greedy over combinations: max -1/2 sum_d log(1 - R^2_d) of the tile embedding",
               "selection_trace": trace, "dilute_steps": dilute_steps},
    )
