"""Native bf16 on CUDA means bf16 in hardware (compute capability 8.0 on): a GPU that only emulates it neither
trains nor serves in bf16 by the auto rule, and QLoRA computes in fp16 there. torch.cuda is faked (no GPU
here): torch's own `is_bf16_supported` runs against a device of the given capability on which emulation
works."""

from types import SimpleNamespace

import pytest
import torch

from pipeline.device import PrecisionUnavailable, has_native_bf16, resolve_precision, serving_dtype
from pipeline.families.joint.backbone import qlora_config

CUDA = torch.device("cuda")


@pytest.fixture
def gpu_of(monkeypatch):
    """Make torch.cuda report one CUDA GPU of compute capability `major`.0 that can emulate bf16."""

    def fake(major: int) -> None:
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(
            torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(major=major)
        )
        monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)

    return fake


def test_a_gpu_that_emulates_bf16_has_no_native_bf16(gpu_of):
    gpu_of(7)  # e.g. a T4 or V100: torch can emulate bf16 there
    assert torch.cuda.is_bf16_supported()  # what the check used to ask: emulation counted
    assert not has_native_bf16(CUDA)
    assert resolve_precision("auto", CUDA) is None  # fp32 by the auto rule
    assert resolve_precision("bf16", CUDA) is torch.bfloat16  # asked for by name: given
    with pytest.raises(PrecisionUnavailable, match="no native bf16"):
        serving_dtype("bf16", CUDA)
    assert qlora_config(CUDA).bnb_4bit_compute_dtype == torch.float16


@pytest.mark.parametrize("major", [8, 9])
def test_ampere_and_later_run_bf16_natively(gpu_of, major):
    gpu_of(major)
    assert has_native_bf16(CUDA)
    assert resolve_precision("auto", CUDA) is torch.bfloat16
    assert serving_dtype("bf16", CUDA) is torch.bfloat16
    assert qlora_config(CUDA).bnb_4bit_compute_dtype == torch.bfloat16
