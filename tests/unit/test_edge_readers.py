"""Sensor readers (simulated, IIO sysfs, external command) and the sampler's fault counting."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from edge_agent.agent import Sampler
from edge_agent.readers import (
    CommandReader,
    IioReader,
    ReaderError,
    SensorReader,
    SimulatedReader,
)
from edge_agent.store import SensorStore

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z (winter)
JULY = 1_784_116_800  # 2026-07-15T12:00:00Z


# -- simulated -----------------------------------------------------------------------
def test_simulated_values_depend_only_on_seed_and_time() -> None:
    a, b = SimulatedReader(seed=3), SimulatedReader(seed=3)
    stamps = range(T0, T0 + 86_400, 300)
    assert a.values("temperature", stamps) == b.values("temperature", stamps)
    assert a.read(T0 + 0.9) == {s: a.value(s, T0) for s in ("temperature", "humidity")}
    assert a.values("humidity", stamps) != SimulatedReader(seed=4).values("humidity", stamps)


def test_simulated_cycles_are_plausible() -> None:
    r = SimulatedReader()
    day = range(JULY - 43_200, JULY + 43_200, 600)
    winter = sum(r.values("temperature", range(T0, T0 + 86_400, 600))) / 144
    summer = sum(r.values("temperature", day)) / 144
    assert summer - winter > 10  # seasonal cycle
    afternoon = r.value("temperature", JULY + 3 * 3600)  # 15:00 UTC
    night = r.value("temperature", JULY - 9 * 3600)  # 03:00 UTC
    assert afternoon > night
    assert all(5.0 <= v <= 100.0 for v in r.values("humidity", range(T0, T0 + 30 * 86_400, 97)))
    assert all(round(v, 2) == v for v in r.values("temperature", day))


def test_simulated_refuses_unknown_sensors() -> None:
    with pytest.raises(ValueError, match="knows temperature, humidity, got pressure"):
        SimulatedReader(sensors=["pressure"])


# -- IIO -----------------------------------------------------------------------------
def iio_device(tmp_path: Path, files: Mapping[str, str]) -> Path:
    dev = tmp_path / "iio:device0"
    dev.mkdir()
    (dev / "name").write_text("fake\n")
    for name, text in files.items():
        (dev / name).write_text(text)
    return dev


def test_iio_processed_channels_in_milli_units(tmp_path: Path) -> None:
    dev = iio_device(tmp_path, {"in_temp_input": "23125\n", "in_humidityrelative_input": "45500"})
    assert IioReader(dev).read(T0) == {"temperature": 23.125, "humidity": 45.5}


def test_iio_raw_scale_and_offset(tmp_path: Path) -> None:
    # (raw + offset) * scale, in milli units (kernel IIO ABI); humidity without offset.
    files = {
        "in_temp_raw": "6000\n",
        "in_temp_offset": "-2000\n",
        "in_temp_scale": "5.000000\n",
        "in_humidityrelative_raw": "2000",
        "in_humidityrelative_scale": "25.5",
    }
    assert IioReader(iio_device(tmp_path, files)).read(T0) == {
        "temperature": 20.0,
        "humidity": 51.0,
    }


def test_iio_indexed_channel_with_a_shared_scale(tmp_path: Path) -> None:
    dev = iio_device(tmp_path, {"in_temp0_raw": "100", "in_temp_scale": "250"})
    assert IioReader(dev).read(T0) == {"temperature": 25.0}


def test_iio_garbage_value_is_a_fault_that_keeps_the_good_channel(tmp_path: Path) -> None:
    dev = iio_device(tmp_path, {"in_temp_input": "21000", "in_humidityrelative_input": "n/a\n"})
    with pytest.raises(ReaderError, match="in_humidityrelative_input is not a number") as info:
        IioReader(dev).read(T0)
    assert info.value.partial == {"temperature": 21.0}


def test_iio_garbage_scale_and_missing_device(tmp_path: Path) -> None:
    dev = iio_device(tmp_path, {"in_temp_raw": "100", "in_temp_scale": "inf"})
    with pytest.raises(ReaderError, match="in_temp_scale is not finite"):
        IioReader(dev).read(T0)
    with pytest.raises(ReaderError, match="does not exist"):
        IioReader(tmp_path / "gone").read(T0)


def test_iio_device_without_channels(tmp_path: Path) -> None:
    dev = iio_device(tmp_path, {"in_voltage0_raw": "12"})
    with pytest.raises(ReaderError, match="no channel"):
        IioReader(dev).read(T0)


# -- command -------------------------------------------------------------------------
def py_command(code: str) -> str:
    return shlex.join([sys.executable, "-c", code])


def test_command_reader_good_json() -> None:
    reader = CommandReader(py_command('print(\'{"temperature": 21.5, "co2": 415}\')'))
    assert reader.read(T0) == {"temperature": 21.5, "co2": 415.0}


@pytest.mark.parametrize(
    ("code", "match"),
    [
        ("print('not json')", "not JSON"),
        ("print('[1, 2]')", "must be a JSON object, got list"),
        ("import sys; sys.stderr.write('sensor busy'); sys.exit(3)", "exit status 3: sensor busy"),
        ("print('{}')", "no readings"),
    ],
)
def test_command_reader_faults(code: str, match: str) -> None:
    with pytest.raises(ReaderError, match=match):
        CommandReader(py_command(code)).read(T0)


def test_command_reader_keeps_good_values_of_a_partly_bad_object() -> None:
    code = 'print(\'{"temperature": 20, "humidity": "wet", "Bad Name": 1, "flag": true}\')'
    with pytest.raises(ReaderError, match="bad readings") as info:
        CommandReader(py_command(code)).read(T0)
    assert info.value.partial == {"temperature": 20.0}


def test_command_reader_timeout_and_missing_program() -> None:
    with pytest.raises(ReaderError, match=r"timed out after 0.2 s"):
        CommandReader(py_command("import time; time.sleep(10)"), timeout_s=0.2).read(T0)
    with pytest.raises(ReaderError, match="cannot run"):
        CommandReader("/nonexistent/sensor-tool").read(T0)
    with pytest.raises(ValueError, match="must not be empty"):
        CommandReader("  ")


# -- sampler -------------------------------------------------------------------------
class FlakyReader(SensorReader):
    """Fails every other read; partial values on failure."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    def read(self, now_s: float) -> dict[str, float]:
        self.calls += 1
        if self.calls % 2 == 0:
            raise ReaderError("sensor timeout", {"temperature": 1.0})
        if self.calls == 3:
            raise RuntimeError("driver bug")
        return {"temperature": 2.0, "humidity": 3.0}


async def test_sampler_counts_faults_and_keeps_sampling(tmp_path: Path) -> None:
    store = SensorStore(str(tmp_path / "s.db"))
    clock = iter(range(T0, T0 + 100)).__next__
    sampler = Sampler(FlakyReader(), store, clock=lambda: float(clock()))
    written = [await sampler.sample_once() for _ in range(5)]
    assert written == [2, 1, 0, 1, 2]
    status = sampler.status()
    assert status["reader"] == "flaky"
    assert status["samples"] == 5 and status["readings"] == 6
    assert status["reader_faults"] == 3 and status["store_faults"] == 0
    assert status["last_fault"] == "reader: sensor timeout"
    assert status["last_sample_ts"] == T0 + 4
    assert store.count() == 6


async def test_sampler_counts_store_faults(tmp_path: Path) -> None:
    class NanReader(SensorReader):
        name = "nan"

        def read(self, now_s: float) -> dict[str, float]:
            return {"temperature": float("nan")}

    sampler = Sampler(NanReader(), SensorStore(str(tmp_path / "s.db")), clock=lambda: T0)
    assert await sampler.sample_once() == 0
    assert sampler.stats.store_faults == 1
    assert "finite" in (sampler.stats.last_fault or "")
