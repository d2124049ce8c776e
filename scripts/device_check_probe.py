"""What CUDA says to ops handed tensors on both sides of the bus, beside what the virtual device
says (developer tool, not imported by the package). On a GPU machine it prints CUDA's verdict
for each case; without one, the virtual device's (a gpusync Session). The cases include those
gpusync does not judge yet (docs/commands/scan.md "Tensors on both sides of the bus": a
convolution's input and weight, a host condition in torch.where, an in-place mix), whose
CUDA wording is what a GPU run of this script brings back (scripts/gpu_validate.sh).

    python scripts/device_check_probe.py            # one line per case: name, then verdict
"""
from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F


def _cases(dev: str) -> dict:
    host_img, dev_img = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8, device=dev)
    return {
        # a convolution: the backend CUDA picks for the input decides the wording
        "conv2d host input (small)": lambda: F.conv2d(torch.randn(1, 3, 4, 4),
                                                      torch.randn(2, 3, 1, 1, device=dev)),
        "conv2d host input (batch 2)": lambda: F.conv2d(host_img,
                                                        torch.randn(4, 3, 3, 3, device=dev)),
        "conv2d host weight": lambda: F.conv2d(dev_img, torch.randn(4, 3, 3, 3)),
        "conv2d host bias": lambda: F.conv2d(dev_img, torch.randn(4, 3, 3, 3, device=dev),
                                             torch.randn(4)),
        "where host condition": lambda: torch.where(torch.ones(3) > 0,
                                                    torch.ones(3, device=dev),
                                                    torch.zeros(3, device=dev)),
        "add_ host vector in place": lambda: torch.ones(3, device=dev).add_(torch.ones(3)),
        "host scalar add_ of a device value": lambda: torch.tensor(0.0).add_(
            torch.tensor(1.0, device=dev)),
        "host vector * device scalar": lambda: torch.ones(3) * torch.tensor(2.0, device=dev),
        "linear host input": lambda: F.linear(torch.randn(2, 3),
                                              torch.randn(4, 3, device=dev),
                                              torch.randn(4, device=dev)),
        "cross_entropy host labels": lambda: F.cross_entropy(torch.randn(4, 3, device=dev),
                                                             torch.tensor([0, 2, 1, 0])),
        "embedding host ids": lambda: F.embedding(torch.tensor([1, 2]),
                                                  torch.randn(10, 3, device=dev)),
        "bce_with_logits host target": lambda: F.binary_cross_entropy_with_logits(
            torch.randn(4, device=dev), torch.ones(4)),
        "layer_norm host weight": lambda: F.layer_norm(torch.randn(2, 4, device=dev), (4,),
                                                       torch.ones(4)),
        "index_select host index": lambda: torch.randn(5, device=dev).index_select(
            0, torch.tensor([0, 3])),
        "index host index (runs on CUDA)": lambda: torch.randn(5, device=dev)[
            torch.tensor([0, 3])],
    }


def verdict(case) -> str:
    try:
        case()
    except RuntimeError as e:
        return str(e).split("\n")[0]
    return "runs"


def main() -> int:
    real = torch.cuda.is_available()
    scope: contextlib.AbstractContextManager = contextlib.nullcontext()
    if not real:
        from gpusync.detect.session import Session

        scope = Session(mode="simulate", virtual_cuda=True)
    with scope:
        print(f"# {'CUDA ' + torch.cuda.get_device_name() if real else 'virtual device'}, "
              f"torch {torch.__version__}")
        for name, case in _cases("cuda").items():
            print(f"{name}: {verdict(case)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
