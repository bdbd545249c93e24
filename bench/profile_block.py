"""Profile the spine's transformer block (rms_norm, causal SDPA attention, SwiGLU MLP) at a
given sequence length on the WebGPU executor: per-dispatch GPU times grouped by kernel.

    python bench/profile_block.py --seq 512 [--device webgpu] [--runs 5]
"""
import argparse
import os
import tempfile

import torch

from delegate.aot import lower
from delegate.models import TransformerBlock, seeded
from delegate.runtime.profile import profile_method


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--device", default="webgpu", choices=("webgpu", "cpu"))
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    model = seeded(TransformerBlock())
    seq = torch.export.Dim("seq", min=2, max=max(args.seq, 16))
    pm = lower(model, (torch.randn(1, 16, 64),), dynamic_shapes=({1: seq},), device=args.device)
    x = torch.randn(1, args.seq, 64)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "block.pte")
        with open(path, "wb") as f:
            f.write(pm.buffer)
        print(f"TransformerBlock(dim=64, heads=4, hidden=176) at seq {args.seq}")
        print(profile_method(path, device=args.device, inputs=[x], runs=args.runs))


if __name__ == "__main__":
    main()
