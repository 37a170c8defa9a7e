"""reduce_amax: values against numpy, the original's shape rules, NaN, dtypes and axis errors."""
import numpy as np
import pytest
import torch

from workbench.quant.utils import reduce_amax


@pytest.fixture
def x():
    torch.manual_seed(0)
    x = torch.randn(3, 1, 4, 5)
    x[0, 0, 1, 2] = -7.0  # the largest magnitude is negative: max(x) alone would miss it
    return x


@pytest.mark.parametrize("axis", [None, 0, 2, -1, [0], [1, 3], (0, 2, 3), [-1, -2]])
def test_values_equal_numpy(x, axis):
    np_axis = axis if axis is None or isinstance(axis, int) else tuple(axis)
    expected = np.max(np.abs(x.numpy()), axis=np_axis, keepdims=axis is not None)
    out = reduce_amax(x, axis, keepdims=True)
    assert np.array_equal(out.numpy(), expected.squeeze() if np.size(expected) == 1 and axis is not None
                          and not isinstance(axis, int) else expected)


def test_whole_tensor_is_0d(x):
    out = reduce_amax(x)
    assert out.shape == () and out.item() == 7.0


def test_shape_rules_of_the_original(x):
    assert reduce_amax(x, 1, keepdims=False).shape == (3, 4, 5)
    assert reduce_amax(x, [0, 2], keepdims=True).shape == (1, 1, 1, 5)
    assert reduce_amax(x, [2, 3], keepdims=False).shape == (3,)  # every size-1 axis squeezed
    assert reduce_amax(x, [0, 1, 2, 3], keepdims=True).shape == ()
    assert torch.equal(reduce_amax(x, [], keepdims=True), x.abs())


def test_nan_propagates_and_dtype_is_kept():
    x = torch.tensor([[float("nan"), 1.0], [-2.0, 0.5]])
    assert torch.isnan(reduce_amax(x))
    assert torch.equal(reduce_amax(x, 0, keepdims=False).nan_to_num(9.0), torch.tensor([9.0, 1.0]))
    half = torch.tensor([-3.0, 2.0]).half()
    assert reduce_amax(half).dtype == torch.float16 and reduce_amax(half).item() == 3.0
    assert reduce_amax(torch.tensor([-3, 2])).item() == 3


def test_no_gradient_is_recorded():
    x = torch.randn(4, 4, requires_grad=True)
    assert not reduce_amax(x, 0).requires_grad


def test_axis_errors(x):
    with pytest.raises(ValueError, match="axis 4 is out of range"):
        reduce_amax(x, 4)
    with pytest.raises(ValueError, match="axis -5 is out of range"):
        reduce_amax(x, [0, -5])
    with pytest.raises(ValueError, match="Cannot reduce more axes"):
        reduce_amax(x, [0, 1, 2, 3, 0])
