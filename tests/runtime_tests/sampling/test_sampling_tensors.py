"""The `[B, 3]` sampling tensor: NxDI's column order, top_k -1 mapping, and NxDI's validation rules."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from neuronmodel_runtime.sampling.params import GREEDY, RowSampling  # noqa: E402
from neuronmodel_runtime.sampling.tensors import sampling_tensor, validate_sampling_tensor  # noqa: E402


def test_columns_are_top_k_top_p_temperature():
    t = sampling_tensor([GREEDY, RowSampling(top_k=40, top_p=0.9, temperature=0.7, seed=3)], global_top_k=256)
    assert t.dtype == torch.float32 and t.shape == (2, 3)
    assert t.tolist() == [[1.0, 1.0, 1.0], [40.0, pytest.approx(0.9), pytest.approx(0.7)]]


def test_top_k_minus_one_becomes_global_top_k():
    t = sampling_tensor([RowSampling(top_k=-1, top_p=1.0, temperature=1.0, seed=None)], global_top_k=50)
    assert t[0, 0].item() == 50.0


def test_empty_batch_has_shape_0_by_3():
    assert sampling_tensor([], global_top_k=8).shape == (0, 3)


def test_valid_tensors_pass_including_minus_one():
    validate_sampling_tensor(torch.tensor([[-1.0, 1.0, 1.0], [1.0, 0.5, 0.1], [8.0, 1e-6, 5.0]]), global_top_k=8)
    validate_sampling_tensor(sampling_tensor([GREEDY] * 3, global_top_k=8), global_top_k=8)


@pytest.mark.parametrize(
    "row, rule",
    [
        ([0.0, 1.0, 1.0], "top-k must be -1 or in"),
        ([-2.0, 1.0, 1.0], "top-k must be -1 or in"),
        ([9.0, 1.0, 1.0], "top-k must be -1 or in"),
        ([2.5, 1.0, 1.0], "top-k must be an integer"),
        ([1.0, 0.0, 1.0], "top-p must be in"),
        ([1.0, 1.01, 1.0], "top-p must be in"),
        ([1.0, float("nan"), 1.0], "top-p must be in"),
        ([1.0, 1.0, 0.0], "temperature must be > 0"),
        ([1.0, 1.0, -1.0], "temperature must be > 0"),
    ],
)
def test_each_nxdi_rule_is_enforced_by_name(row, rule):
    with pytest.raises(ValueError, match=rule):
        validate_sampling_tensor(torch.tensor([[1.0, 1.0, 1.0], row]), global_top_k=8)


@pytest.mark.parametrize("shape", [(2, 2), (3,), (1, 4)])
def test_shape_must_be_batch_by_3(shape):
    with pytest.raises(ValueError, match=r"shape \[batch, 3\]"):
        validate_sampling_tensor(torch.ones(shape), global_top_k=8)


def test_integer_tensors_are_accepted():
    validate_sampling_tensor(torch.tensor([[4, 1, 1]]), global_top_k=8)
