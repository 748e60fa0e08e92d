"""GPU table loading and validation (docs/roofline.md §1.5)."""

from __future__ import annotations

import json

import pytest

from blisjax.config import ConfigError, HardwareConfig, available_hardware, load_hardware


@pytest.mark.parametrize(
    "name, values",
    [
        ("H100", (989.5, 1979.0, 3.35, 0.45, 0.30, 80.0)),
        ("A100-SXM", (312.0, 0.0, 2.039, 0.38, 0.18, 80.0)),
        ("A100-80", (312.0, 0.0, 2.039, 0.38, 0.18, 80.0)),
        ("L40S", (362.05, 1466.0, 0.864, 0.32, 0.08, 48.0)),
    ],
)
def test_shipped_hardware_table(name, values):
    hw = load_hardware(name)
    got = (
        hw.tflops_peak,
        hw.tflops_fp8,
        hw.bw_peak_tbs,
        hw.mfu_prefill,
        hw.mfu_decode,
        hw.memory_gib,
    )
    assert got == values
    assert all(isinstance(v, float) for v in got)
    assert hw.has_fp8 == (values[1] > 0)


def test_available_hardware_skips_comments():
    assert set(available_hardware()) == {"H100", "A100-SXM", "A100-80", "L40S"}


def test_lookup_is_exact():
    with pytest.raises(ConfigError) as err:
        load_hardware("h100")
    assert err.value.path == "hardware"
    assert "H100" in str(err.value) and "L40S" in str(err.value)


def test_user_hardware_file(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(
        json.dumps(
            {
                "_comment": "x",
                "B200": {
                    "_comment": "y",
                    "TFlopsPeak": 2250,
                    "BwPeakTBs": 8,
                    "mfuPrefill": 0.5,
                    "mfuDecode": 0.3,
                    "MemoryGiB": 180,
                    "NewField": 1,
                },
            }
        )
    )
    hw = load_hardware("B200", path)
    assert (hw.tflops_peak, hw.tflops_fp8, hw.bw_peak_tbs, hw.memory_gib) == (
        2250.0,
        0.0,
        8.0,
        180.0,
    )
    with pytest.raises(ConfigError, match="unknown GPU 'H100'"):
        load_hardware("H100", path)


def test_missing_required_key_is_an_error(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"X": {"TFlopsPeak": 100, "mfuPrefill": 0.5, "mfuDecode": 0.3}}))
    with pytest.raises(
        ConfigError, match=r"hardware\['X'\]\.bw_peak_tbs: must be a finite number > 0"
    ):
        load_hardware("X", path)


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read hardware file"):
        load_hardware("H100", tmp_path / "missing.json")


GOOD = dict(
    name="G",
    tflops_peak=100.0,
    tflops_fp8=0.0,
    bw_peak_tbs=1.0,
    mfu_prefill=0.5,
    mfu_decode=0.3,
    memory_gib=0.0,
)


@pytest.mark.parametrize(
    "field, value",
    [
        ("tflops_peak", 0.0),
        ("tflops_peak", -1.0),
        ("bw_peak_tbs", float("nan")),
        ("mfu_prefill", 0.0),
        ("mfu_decode", 1.5),
        ("tflops_fp8", -1.0),
        ("memory_gib", float("inf")),
        ("memory_gib", "80"),
    ],
)
def test_invalid_hardware_names_field(field, value):
    with pytest.raises(ConfigError) as err:
        HardwareConfig(**{**GOOD, field: value})
    assert err.value.path == f"hardware['G'].{field}"


def test_zero_fp8_and_memory_allowed():
    hw = HardwareConfig(**GOOD)
    assert not hw.has_fp8 and hw.memory_gib == 0.0
