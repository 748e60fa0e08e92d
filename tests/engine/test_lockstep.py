"""``lockstep.upd``: a masked write leaves every other element, and every element of an
inactive lane, as it was; expected values are NumPy assignments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blisjax.engine.lockstep import LANES, upd


def _expected(arr, idx, val, active):
    out = arr.copy()
    for lane in range(arr.shape[0]):
        if active[lane]:
            key = tuple(np.asarray(k)[lane] for k in idx) if isinstance(idx, tuple) \
                else np.asarray(idx)[lane]
            out[lane][key] = np.asarray(val)[lane]
    return out


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.int8])
def test_upd_writes_one_element_of_active_lanes_only(dtype):
    rng = np.random.default_rng(3)
    arr = rng.integers(-50, 50, (6, 3, 5)).astype(dtype)
    i = np.array([0, 1, 2, 2, 1, -1])  # -1: the last row, as in NumPy
    j = np.array([4, 0, 3, 3, -2, 1])
    val = rng.integers(60, 90, 6).astype(dtype)
    active = np.array([True, False, True, True, False, True])
    got = jax.vmap(lambda a, i, j, v, on: upd(a, (i, j), v, on), axis_name=LANES)(
        arr, i, j, val, active)
    np.testing.assert_array_equal(np.asarray(got), _expected(arr, (i, j), val, active))


def test_upd_writes_a_whole_row_and_casts_the_value_to_the_arrays_dtype():
    arr = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    row = np.full((2, 4), 7, np.int64)
    active = np.array([True, False])
    got = jax.vmap(lambda a, v, on: upd(a, 1, v, on))(arr, row, active)
    assert got.dtype == jnp.int32
    want = arr.copy()
    want[0, 1] = 7
    np.testing.assert_array_equal(np.asarray(got), want)


def test_upd_out_of_bounds_index_writes_nothing():
    arr = np.zeros((2, 4), np.int32)
    got = jax.vmap(lambda a, on: upd(a, 4, 9, on))(arr, np.array([True, True]))
    np.testing.assert_array_equal(np.asarray(got), arr)


def test_upd_with_a_mask_per_element_keeps_the_unmasked_elements():
    arr = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    mask = np.array([[True, False, True, False], [False, False, False, True]])
    got = jax.vmap(lambda a, m: upd(a, 1, jnp.full(4, -1, jnp.int32), m))(arr, mask)
    want = arr.copy()
    want[:, 1] = np.where(mask, -1, arr[:, 1])
    np.testing.assert_array_equal(np.asarray(got), want)
