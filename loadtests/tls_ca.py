"""A throwaway certificate authority for TLS tests and benchmarks, made with the openssl CLI.

Keys are ECDSA P-256, certificates last two days. `ThrowawayCa.issue` signs a leaf that
is good both as a TLS server and as a TLS client (one identity per process, as a Tailgate
process uses it: a task server listens with it and registers with it), with the names it
is given as subject alternative names (IP addresses and DNS names)::

    ca = ThrowawayCa.create(tmp_path / "ca")
    server = ca.issue("ts-1", ips=["127.0.0.1"])   # server.cert, server.key, server.serial
    print(ca.cert)                                 # the trust anchor (a ca_file)

Never for production: the CA's key sits unencrypted beside its certificate.
"""

from __future__ import annotations

import ipaddress
import itertools
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Issued", "ThrowawayCa", "openssl_missing"]

DAYS = 2
_CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl_missing() -> str | None:
    """Why no CA can be made here (no openssl on PATH), else None."""
    return None if shutil.which("openssl") else "the openssl command is not installed"


def _openssl(*args: str | Path, cwd: Path) -> None:
    done = subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate the CA signed, with its key (PEM files)."""

    cert: Path
    key: Path
    serial: int
    """The certificate's serial number (what `ssl.getpeercert()` shows, in hex)."""


@dataclass(slots=True)
class ThrowawayCa:
    """A CA in a folder: ca.pem (its certificate), ca.key, and the leaves it issued."""

    folder: Path
    name: str = "Tailgate throwaway CA"
    _serials: itertools.count[int] = field(default_factory=lambda: itertools.count(0x1001))

    @property
    def cert(self) -> Path:
        """The CA's certificate: the trust anchor peers verify against (`ca_file`)."""
        return self.folder / "ca.pem"

    @property
    def key(self) -> Path:
        return self.folder / "ca.key"

    @classmethod
    def create(cls, folder: Path | str, name: str = "Tailgate throwaway CA") -> ThrowawayCa:
        """Make a new CA in `folder` (created if missing)."""
        ca = cls(Path(folder), name)
        ca.folder.mkdir(parents=True, exist_ok=True)
        _openssl(
            "req", "-x509", *_CURVE, "-keyout", ca.key, "-out", ca.cert, "-days", DAYS,
            "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash",
            cwd=ca.folder,
        )  # fmt: skip
        return ca

    def issue(
        self,
        name: str,
        *,
        ips: Sequence[str] = ("127.0.0.1",),
        dns: Sequence[str] = (),
        out: Path | str | None = None,
    ) -> Issued:
        """Sign a leaf named `name` (its CN) for these IP addresses and DNS names; its files
        are <name>.pem and <name>.key in `out` (default: the CA's folder), overwritten."""
        folder = Path(out) if out is not None else self.folder
        folder.mkdir(parents=True, exist_ok=True)
        sans = [f"IP:{ipaddress.ip_address(ip)}" for ip in ips] + [f"DNS:{d}" for d in dns]
        serial = next(self._serials)
        cert, key = folder / f"{name}.pem", folder / f"{name}.key"
        csr, ext = folder / f"{name}.csr", folder / f"{name}.ext"
        lines = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature",
            "extendedKeyUsage=serverAuth,clientAuth",
            "subjectKeyIdentifier=hash",
            "authorityKeyIdentifier=keyid",
        ]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        # Written beside the old ones and renamed over them: a reader never sees half a file.
        new_cert, new_key = folder / f".{name}.pem.new", folder / f".{name}.key.new"
        _openssl("req", "-new", *_CURVE, "-keyout", new_key, "-out", csr, "-subj", f"/CN={name}",
                 cwd=folder)  # fmt: skip
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key,
            "-set_serial", serial, "-days", DAYS, "-sha256", "-extfile", ext, "-out", new_cert,
            cwd=folder,
        )  # fmt: skip
        new_key.replace(key)
        new_cert.replace(cert)
        csr.unlink()
        ext.unlink()
        return Issued(cert, key, serial)
