"""PartitionedRNG: documented derivation, determinism and subsystem isolation (docs/semantics.md
§8.6, §11 BC-10)."""

import numpy as np
import pytest

from blisjax.workload import PartitionedRNG
from blisjax.workload.rng import fnv1a_64


@pytest.mark.parametrize(
    ("text", "expected"),
    [  # published FNV-1a 64-bit test vectors
        (b"", 0xCBF29CE484222325),
        (b"a", 0xAF63DC4C8601EC8C),
        (b"foobar", 0x85944171F73967E8),
    ],
)
def test_fnv1a_64_matches_published_vectors(text, expected):
    assert fnv1a_64(text) == expected


def test_stream_follows_documented_derivation():
    # stream("a") = PCG64(SeedSequence(entropy=seed, spawn_key=(FNV-1a-64("a"),)))
    expected = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(7, spawn_key=(0xAF63DC4C8601EC8C,)))
    )
    got = PartitionedRNG(7).stream("a")
    np.testing.assert_array_equal(got.random(16), expected.random(16))


def test_negative_seed_is_taken_modulo_2_64():
    expected = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(2**64 - 1, spawn_key=(0xAF63DC4C8601EC8C,)))
    )
    np.testing.assert_array_equal(PartitionedRNG(-1).stream("a").random(4), expected.random(4))


def test_bc10_drawing_one_stream_never_changes_another():
    shared = PartitionedRNG(42)
    shared.stream("workload").random(100)
    after_workload = shared.stream("router").random(100)
    alone = PartitionedRNG(42).stream("router").random(100)
    np.testing.assert_array_equal(after_workload, alone)


def test_creation_order_does_not_matter():
    a = PartitionedRNG(5)
    a_first = a.stream("x", 1).integers(0, 1 << 30, 10)
    a.stream("y")
    b = PartitionedRNG(5)
    b.stream("y").random(1000)
    np.testing.assert_array_equal(b.stream("x", 1).integers(0, 1 << 30, 10), a_first)


def test_same_seed_same_draws_and_different_seed_or_name_differs():
    base = PartitionedRNG(1).stream("workload").random(8)
    np.testing.assert_array_equal(PartitionedRNG(1).stream("workload").random(8), base)
    assert not np.array_equal(PartitionedRNG(2).stream("workload").random(8), base)
    assert not np.array_equal(PartitionedRNG(1).stream("router").random(8), base)


def test_name_paths_hash_per_component():
    rng = PartitionedRNG(3)
    nested = rng.seed_sequence("a", "b").generate_state(4)
    joined = rng.seed_sequence("a/b").generate_state(4)
    assert not np.array_equal(nested, joined)
    # integers are hashed through str(): documented aliasing
    np.testing.assert_array_equal(
        rng.seed_sequence("workload", 0).generate_state(4),
        rng.seed_sequence("workload", "0").generate_state(4),
    )


def test_stream_is_cached_so_draws_continue():
    rng = PartitionedRNG(9)
    first = rng.stream("s").random(3)
    second = rng.stream("s").random(3)
    both = PartitionedRNG(9).stream("s").random(6)
    np.testing.assert_array_equal(np.concatenate([first, second]), both)


def test_invalid_names_and_seeds_are_rejected():
    with pytest.raises(ValueError):
        PartitionedRNG(1).stream()
    with pytest.raises(TypeError):
        PartitionedRNG(1).stream(True)
    with pytest.raises(TypeError):
        PartitionedRNG(1.5)
