"""Tile -> model input. One callable per backbone, carried by :class:`~pathtwt.models.registry.Backbone`
so that the resize and normalisation of a model are never chosen separately from it.

The backbone's preprocessing is timm's data config: :func:`data_config` is written into
the model's ``pretrained_cfg``, and :meth:`TileTransform.for_model` reads it back with
``timm.data.resolve_model_data_config``, so a user of the model with timm alone
(``create_transform(**resolve_model_data_config(model))``) normalises exactly as pathtwt
does. Tiles are then transformed by a numpy/OpenCV fast path (one array operation per
tile in the extraction workers, no PIL round trip); it equals timm's pipeline on tiles
at the input size to float rounding. On tiles of another size the fast path's OpenCV
resize (area when shrinking, bilinear when enlarging) is kept: timm resizes with PIL,
which differs from it by a few grey levels.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def data_config(input_size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> dict[str, Any]:
    """The ``pretrained_cfg`` entries timm's ``resolve_model_data_config`` reads: the whole
    tile, resized to the input size, normalised with the backbone's mean and std."""
    return {
        "input_size": (3, int(input_size), int(input_size)),
        "mean": tuple(float(v) for v in mean),
        "std": tuple(float(v) for v in std),
        "crop_pct": 1.0,
        "crop_mode": "center",
        "interpolation": "bilinear",
    }


class TileTransform:
    """uint8 RGB tile (H, W, 3) numpy array or PIL image -> float32 tensor (3, S, S),
    resized to ``input_size`` (area when shrinking, bilinear when enlarging) and
    normalised with the backbone's mean and std. Picklable, so DataLoader workers run it."""

    # how tiles of another size are brought to input_size (recorded in features files)
    RESIZE = "opencv INTER_AREA when shrinking, INTER_LINEAR when enlarging; none at input size"

    def __init__(self, input_size: int, mean: tuple[float, ...], std: tuple[float, ...]):
        self.input_size = int(input_size)
        self.mean_rgb = tuple(float(v) for v in mean)
        self.std_rgb = tuple(float(v) for v in std)
        self.mean = np.asarray(mean, dtype=np.float32) * 255.0
        self.inv_std = 1.0 / (np.asarray(std, dtype=np.float32) * 255.0)

    def __repr__(self) -> str:
        return f"TileTransform(input_size={self.input_size})"

    @classmethod
    def for_model(cls, model: Any) -> "TileTransform":
        """The transform of a timm model, from its data config (see :func:`data_config`)."""
        from timm.data import resolve_model_data_config

        config = resolve_model_data_config(model)
        height, width = config["input_size"][-2:]
        if height != width:
            raise ValueError(f"square inputs only, the model's data config says {height} x {width}")
        return cls(input_size=height, mean=config["mean"], std=config["std"])

    def timm_pipeline(self) -> Any:
        """timm's eval transform for the same data config (PIL image -> tensor)."""
        from timm.data import create_transform

        return create_transform(**data_config(self.input_size, self.mean_rgb, self.std_rgb), is_training=False)

    def describe(self) -> dict[str, Any]:
        """The preprocessing as plain values: mean and std (of [0, 1] RGB), input size, resize."""
        return {"mean": list(self.mean_rgb), "std": list(self.std_rgb), "input_size": self.input_size,
                "resize": self.RESIZE}

    def resize(self, image: Any) -> np.ndarray:
        arr = np.asarray(image)
        if arr.ndim != 3 or arr.shape[2] < 3:
            raise ValueError(f"expected an RGB image (H, W, 3), got shape {arr.shape}")
        arr = arr[:, :, :3]
        h, w = arr.shape[:2]
        if (h, w) != (self.input_size, self.input_size):
            import cv2

            shrink = h > self.input_size or w > self.input_size
            interp = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
            arr = cv2.resize(np.ascontiguousarray(arr), (self.input_size, self.input_size), interpolation=interp)
        return arr

    def normalise(self, arr: np.ndarray) -> np.ndarray:
        """uint8 (..., S, S, 3) -> float32 (..., 3, S, S)."""
        out = (arr.astype(np.float32) - self.mean) * self.inv_std
        return np.ascontiguousarray(np.moveaxis(out, -1, -3))

    def __call__(self, image: Any):
        import torch

        return torch.from_numpy(self.normalise(self.resize(image)))

    def batch(self, images: Any):
        """Stack of tiles (B, H, W, 3) or list of images -> (B, 3, S, S) tensor."""
        import torch

        resized = np.stack([self.resize(im) for im in images]) if len(images) else np.zeros(
            (0, self.input_size, self.input_size, 3), np.uint8
        )
        return torch.from_numpy(self.normalise(resized))

    def _constants(self, device: Any) -> tuple[Any, Any]:
        """The mean and 1/std as tensors on ``device``, made once per device (a batch loop
        on a GPU would otherwise copy them over at every batch)."""
        import torch

        cache = self.__dict__.setdefault("_on_device", {})
        key = str(device)
        if key not in cache:
            cache[key] = (torch.from_numpy(self.mean).to(device), torch.from_numpy(self.inv_std).to(device))
        return cache[key]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_on_device"}

    def normalise_batch(self, images: Any, device: Any = "cpu", *, channels_first: bool = False):
        """uint8 tiles (B, S, S, 3) at the input size (a tensor, as extraction's workers send
        them) -> float32 (B, 3, S, S) on ``device``: the arithmetic of :meth:`normalise`
        with the same float32 constants, run where the model is, so a batch crosses to a
        GPU as a quarter of float32's bytes. ``channels_first``: the tiles are already
        (B, 3, S, S), uint8 or float in [0, 255] (distillation's tiles, augmented on the
        device)."""
        import torch

        x = torch.as_tensor(images).to(device, non_blocking=True)
        mean, inv_std = self._constants(x.device)
        if channels_first:
            return (x.float() - mean.view(1, -1, 1, 1)) * inv_std.view(1, -1, 1, 1)
        return ((x.float() - mean) * inv_std).permute(0, 3, 1, 2).contiguous()
