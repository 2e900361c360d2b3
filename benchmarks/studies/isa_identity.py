"""Are fp32 tile features the same under another CPU instruction set? Tiles one real slide,
then runs `pathtwt extract --precision fp32` on its tiles once per setting below, each in
a fresh process, and compares every features file with the first, bit for bit and by the
largest absolute difference:

- ``default``: the CPU's own instruction set, and ``default-again`` (a second process at
  the same setting: the control, which says whether a run repeats itself bit for bit);
- ``aten-avx2``: ``ATEN_CPU_CAPABILITY=avx2`` (torch's own vectorised kernels: norms,
  softmax, activations, element-wise);
- ``all-avx2``: that, plus ``ONEDNN_MAX_CPU_ISA=AVX2`` and ``MKL_ENABLE_INSTRUCTIONS=AVX2``
  (the matrix multiplies too), the nearest this machine comes to an AVX2-only CPU.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/studies/isa_identity.py [--slide ../shared/data/slides/CMU-1-Small-Region.svs]

Prints one JSON object. On an AVX2-only CPU the three settings are the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
SETTINGS = {
    "default": {},
    "default-again": {},  # the control: a second process at the same setting
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "all-avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slide", type=Path, default=SHARED / "data" / "slides" / "CMU-1-Small-Region.svs")
    parser.add_argument("--weights", type=Path, default=SHARED / "weights" / "vit_s14_imgfocus.safetensors")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each extraction (default 1)")
    args = parser.parse_args()

    import h5py
    import numpy as np

    pathtwt = [sys.executable, "-m", "pathtwt"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        coords = work / "slide.h5"
        subprocess.run([*pathtwt, "tile", str(args.slide), "--out", str(coords), "--tile-size", "224"], check=True,
                       capture_output=True)
        features: dict[str, np.ndarray] = {}
        for name, env in SETTINGS.items():
            out = work / f"{name}.h5"
            subprocess.run(
                [*pathtwt, "extract", str(args.slide), "--coords", str(coords), "--backbone", "vit-s14-imgfocus",
                 "--weights", str(args.weights), "--precision", "fp32", "--device", "cpu", "--workers", "0",
                 "--threads", str(args.threads), "--no-progress", "--out", str(out)],
                check=True, capture_output=True, env={**os.environ, **env},
            )
            with h5py.File(out, "r") as f:
                features[name] = f["features"][:]
        import torch

        reference = features["default"]
        result = {
            "slide": str(args.slide),
            "tiles": int(reference.shape[0]),
            "dim": int(reference.shape[1]),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__,
            "against_default": {
                name: {
                    "bit_identical": bool(np.array_equal(f, reference)),
                    "max_abs_diff": float(np.abs(f - reference).max()),
                    "max_rel_diff": float((np.abs(f - reference) / (np.abs(reference) + 1e-6)).max()),
                    "differing_values": int((f != reference).sum()),
                }
                for name, f in features.items() if name != "default"
            },
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
