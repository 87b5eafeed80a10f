"""Sensor readers: where an agent's readings come from, behind one small ABC.

``simulated`` (default) computes temperature and humidity with daily and seasonal cycles
and noise, as a pure function of (seed, timestamp): a backfill and live sampling agree.
``iio`` reads a Linux IIO device directory in sysfs (kernel IIO ABI). ``command`` runs a
program that prints one JSON object ``{sensor: number}``.

Errors::

    Exception
     └── ReaderError   one read failed (device gone, garbage value, command failed or timed
                       out); ``partial`` holds the values that were read. The agent logs and
                       counts it and keeps going: a reader fault is never fatal.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "IIO_CHANNELS",
    "SIMULATED_SENSORS",
    "CommandReader",
    "IioReader",
    "ReaderError",
    "SensorReader",
    "SimulatedReader",
    "check_sensor_name",
]

SIMULATED_SENSORS = ("temperature", "humidity")
IIO_CHANNELS = {"temperature": "temp", "humidity": "humidityrelative"}
"""Our sensor name -> IIO channel type; both are in milli-units after scale and offset."""
_SENSOR_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_MASK64 = (1 << 64) - 1
_2_POW_M32 = 2.0**-32
_TWO_PI = 2.0 * math.pi
_YEAR_DAYS = 365.2422


class ReaderError(Exception):
    """A read failed; ``partial`` holds the sensors that were read all the same."""

    def __init__(self, message: str, partial: Mapping[str, float] | None = None) -> None:
        super().__init__(message)
        self.partial = dict(partial or {})


def check_sensor_name(name: str) -> str:
    """Return the name if it is a valid sensor name (a-z, 0-9, _; 1..32), else ValueError."""
    if not isinstance(name, str) or not _SENSOR_NAME.fullmatch(name):
        raise ValueError(f"sensor name must match [a-z][a-z0-9_]{{0,31}}, got {name!r}")
    return name


class SensorReader(ABC):
    """Reads the current value of each of its sensors."""

    name: str

    @abstractmethod
    def read(self, now_s: float) -> dict[str, float]:
        """Current readings {sensor: value}; may block briefly (run it off the event loop)."""


# -- simulated -------------------------------------------------------------------------
_MODELS: dict[str, tuple[int, float, float, float, float, float, float]] = {
    # sensor: (noise stream, base, season amplitude, day amplitude, noise sigma, min, max)
    "temperature": (0, 11.0, 9.0, 4.0, 0.4, -40.0, 85.0),
    "humidity": (1, 65.0, -12.0, -12.0, 2.5, 5.0, 100.0),
}


class SimulatedReader(SensorReader):
    """Temperature (°C) and relative humidity (%) of a temperate site, deterministic per ts.

    temperature = 11 + 9·season + 4·day + N(0, 0.4); humidity = 65 - 12·season - 12·day
    + N(0, 2.5), clipped to 5..100; season peaks in mid-July, day at 15:00 UTC. The noise
    is a Box-Muller normal from a splitmix64 hash of (seed, sensor, ts), so a value depends
    on nothing else. Values are rounded to 0.01, the resolution of common Pi sensors.
    """

    name = "simulated"

    def __init__(self, seed: int = 0, sensors: Sequence[str] = SIMULATED_SENSORS) -> None:
        unknown = [s for s in sensors if s not in _MODELS]
        if unknown or not sensors:
            raise ValueError(
                f"sensors: the simulated reader knows {', '.join(SIMULATED_SENSORS)}, "
                f"got {', '.join(sensors) or 'none'}"
            )
        self.seed = seed
        self.sensors = tuple(dict.fromkeys(sensors))

    def value(self, sensor: str, ts: int) -> float:
        """The reading of `sensor` at unix second `ts` (a pure function)."""
        return self.values(sensor, (ts,))[0]

    def values(self, sensor: str, timestamps: Iterable[int]) -> list[float]:
        """The readings of `sensor` at each unix second (one tight loop, for backfills)."""
        model = _MODELS.get(sensor)
        if model is None:
            raise ValueError(f"sensor: unknown to the simulated reader: {sensor!r}")
        stream, base, season_amp, day_amp, sigma, lo, hi = model
        salt = (self.seed * 0x9E3779B97F4A7C15 + stream * 0xD1B54A32D192ED03) & _MASK64
        cos, log, sqrt, two_pi, mask = math.cos, math.log, math.sqrt, _TWO_PI, _MASK64
        out: list[float] = []
        for ts in timestamps:
            days = ts / 86_400
            season = cos(two_pi * (days - 196.0) / _YEAR_DAYS)  # 196: ~15 July
            day = cos(two_pi * (days % 1.0 - 0.625))  # 0.625: 15:00
            # splitmix64's finaliser of (seed, sensor, ts), then Box-Muller on its two halves.
            h = (salt + ts) & mask
            h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & mask
            h = (h ^ (h >> 27)) * 0x94D049BB133111EB & mask
            h ^= h >> 31
            u1 = ((h >> 32) + 1) * _2_POW_M32  # (0, 1]: the log is finite
            noise = sqrt(-2.0 * log(u1)) * cos(two_pi * (h & 0xFFFFFFFF) * _2_POW_M32)
            v = base + season_amp * season + day_amp * day + sigma * noise
            out.append(round(min(hi, max(lo, v)), 2))
        return out

    def read(self, now_s: float) -> dict[str, float]:
        ts = int(now_s)
        return {s: self.value(s, ts) for s in self.sensors}

    def __repr__(self) -> str:
        return f"SimulatedReader(seed={self.seed}, sensors={self.sensors})"


# -- Linux IIO -------------------------------------------------------------------------
class IioReader(SensorReader):
    """One IIO device directory (e.g. /sys/bus/iio/devices/iio:device0).

    Per channel, following the kernel ABI (Documentation/ABI/testing/sysfs-bus-iio): the
    processed ``in_<type>_input`` when present, else ``(in_<type>_raw + in_<type>_offset)
    * in_<type>_scale`` (offset 0 and scale 1 when absent); both give milli °C for ``temp``
    and milli %RH for ``humidityrelative``, which are divided by 1000. An indexed channel
    (``in_temp0_input``) is used when the plain one is absent.
    """

    name = "iio"

    def __init__(self, device_dir: str | Path) -> None:
        self.device_dir = Path(device_dir)

    def read(self, now_s: float) -> dict[str, float]:
        if not self.device_dir.is_dir():
            raise ReaderError(f"iio: device directory {self.device_dir} does not exist")
        values: dict[str, float] = {}
        errors: list[str] = []
        for sensor, channel in IIO_CHANNELS.items():
            try:
                value = self._channel(channel)
            except ReaderError as exc:
                errors.append(str(exc))
                continue
            if value is not None:
                values[sensor] = value
        if errors:
            raise ReaderError("; ".join(errors), values)
        if not values:
            kinds = ", ".join(f"in_{c}_input/_raw" for c in IIO_CHANNELS.values())
            raise ReaderError(f"iio: no channel in {self.device_dir} (looked for {kinds})")
        return values

    def _channel(self, channel: str) -> float | None:
        """The channel's value in base units, None if the device has no such channel."""
        for prefix in (f"in_{channel}", f"in_{channel}0"):
            processed = self.device_dir / f"{prefix}_input"
            if processed.exists():
                return self._number(processed) / 1000.0
            raw = self.device_dir / f"{prefix}_raw"
            if raw.exists():
                scale = self._attribute(prefix, channel, "scale", 1.0)
                offset = self._attribute(prefix, channel, "offset", 0.0)
                return (self._number(raw) + offset) * scale / 1000.0
        return None

    def _attribute(self, prefix: str, channel: str, attr: str, default: float) -> float:
        # An indexed channel may share its type's attribute (in_temp_scale for in_temp0_raw).
        for name in (f"{prefix}_{attr}", f"in_{channel}_{attr}"):
            path = self.device_dir / name
            if path.exists():
                return self._number(path)
        return default

    @staticmethod
    def _number(path: Path) -> float:
        try:
            text = path.read_text().strip()
        except OSError as exc:  # EIO from a sensor that missed its timing, a device unplugged
            raise ReaderError(f"iio: cannot read {path.name}: {exc.strerror or exc}") from exc
        try:
            value = float(text)
        except ValueError as exc:
            raise ReaderError(f"iio: {path.name} is not a number: {text[:40]!r}") from exc
        if not math.isfinite(value):
            raise ReaderError(f"iio: {path.name} is not finite: {text[:40]!r}")
        return value

    def __repr__(self) -> str:
        return f"IioReader({str(self.device_dir)!r})"


# -- external command ------------------------------------------------------------------
class CommandReader(SensorReader):
    """Runs a command (no shell) that prints a JSON object {sensor: number} on stdout."""

    name = "command"

    def __init__(self, command: str | Sequence[str], timeout_s: float = 10.0) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("command: must not be empty")
        if not timeout_s > 0:
            raise ValueError(f"command timeout: must be > 0, got {timeout_s}")
        self.argv = argv
        self.timeout_s = timeout_s

    def read(self, now_s: float) -> dict[str, float]:
        try:
            proc = subprocess.run(
                self.argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ReaderError(f"command: timed out after {self.timeout_s:g} s") from exc
        except OSError as exc:
            raise ReaderError(f"command: cannot run {self.argv[0]!r}: {exc}") from exc
        if proc.returncode != 0:
            tail = proc.stderr.decode("utf-8", "replace").strip()[-200:]
            raise ReaderError(f"command: exit status {proc.returncode}: {tail or 'no stderr'}")
        try:
            doc = json.loads(proc.stdout)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ReaderError(f"command: output is not JSON: {proc.stdout[:60]!r}") from exc
        if not isinstance(doc, dict):
            raise ReaderError(f"command: output must be a JSON object, got {type(doc).__name__}")
        values: dict[str, float] = {}
        bad: list[str] = []
        for key, value in doc.items():
            number = _finite(value)
            if number is not None and _SENSOR_NAME.fullmatch(key):
                values[key] = number
            else:
                bad.append(f"{key!r}: {value!r}"[:60])
        if bad or not values:
            detail = ", ".join(bad[:5]) if bad else "no readings"
            raise ReaderError(f"command: bad readings ({detail})", values)
        return values

    def __repr__(self) -> str:
        return f"CommandReader({shlex.join(self.argv)!r}, timeout_s={self.timeout_s})"


def _finite(value: object) -> float | None:
    """The value as a finite float, or None for anything else (bool, string, NaN, 1e999)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
