"""``TensorIndex.first_non_finite``: NaN and infinities found from bit patterns in every
float dtype the doctor reads, the largest finite values not mistaken for them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import save_file  # noqa: E402

from vllm_kimi_ext.checkpoints.safetensors_headers import TensorIndex  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e5m2,
          torch.float8_e4m3fn]


def _index(tmp_path, tensor, name="w"):
    save_file({name: tensor, "ids": torch.arange(4)}, str(tmp_path / "model.safetensors"))
    return TensorIndex.from_dir(tmp_path)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_finite_extremes_pass_and_the_first_bad_element_is_found(tmp_path, dtype):
    info = torch.finfo(dtype)
    values = torch.tensor([0.0, -0.0, info.max, -info.max, info.tiny, info.smallest_normal,
                           1.0, -1.0] * 3, dtype=torch.float64).to(dtype)
    assert _index(tmp_path, values).first_non_finite("w") is None
    for bad, at in ((float("nan"), 5), (float("inf"), 17), (float("-inf"), 0)):
        broken = values.to(torch.float64).clone()
        broken[at] = bad
        converted = broken.to(dtype)
        if torch.isfinite(converted.to(torch.float64)).all():  # a format without infinity
            continue
        index = _index(tmp_path, converted)
        # chunks smaller than the tensor: the position is counted across chunks
        assert index.first_non_finite("w", chunk_elements=4) == at, (dtype, bad)
        assert index.first_non_finite("ids") is None  # integer tensors are not read


def test_a_2d_tensor_reports_the_flat_position(tmp_path):
    w = torch.zeros(3, 5, dtype=torch.bfloat16)
    w[2, 1] = float("nan")
    assert _index(tmp_path, w).first_non_finite("w") == 11
