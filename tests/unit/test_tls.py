"""The [tls] table and the certificate reloader (taskserver.tls): no sockets, no files read.

Contexts from real certificate files, the handshakes and the refusals are tested with real
processes in tests/integration/test_tls.py.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import tomllib
from pathlib import Path

import pytest

from deploy.config import ConfigError, parse_config
from deploy.config_toml import dump_config
from edge_agent.config import AgentConfigError, load_agent_config
from taskserver.tls import (
    CLOSED_AT_HANDSHAKE,
    ClientAuth,
    ReloadingContext,
    TlsConfig,
    tls_argv,
    tls_problem,
    with_tls_options,
)

# -- the reloader, with a fake clock, fake stat and a fake builder --------------------------


class FakeFiles:
    """stat() over a dict of path -> (mtime_ns, size, inode); a missing path raises."""

    def __init__(self, **files: tuple[int, int, int]) -> None:
        self.files = {f"/{k}": v for k, v in files.items()}

    def stat(self, path: str) -> os.stat_result:
        if path not in self.files:
            raise FileNotFoundError(2, "No such file or directory", path)
        mtime_ns, size, ino = self.files[path]
        # st_mode, st_ino, st_dev, st_nlink, st_uid, st_gid, st_size, atime, mtime, ctime
        # (ints), then the float times, then the _ns times.
        return os.stat_result((0, ino, 0, 1, 0, 0, size, 0, 0, 0, 0.0, 0.0, 0.0, 0, mtime_ns, 0))


class Builder:
    """Contexts to hand out, one per call; raises while `broken` is set."""

    def __init__(self) -> None:
        self.built: list[ssl.SSLContext] = []
        self.broken: Exception | None = None

    def __call__(self) -> ssl.SSLContext:
        if self.broken is not None:
            raise self.broken
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.built.append(ctx)
        return ctx


def _reloader(
    files: FakeFiles, build: Builder, now: list[float], every_s: float = 5.0
) -> ReloadingContext:
    return ReloadingContext(
        build,
        ["/cert", "/key"],
        what="test listener",
        check_every_s=every_s,
        clock=lambda: now[0],
        stat=files.stat,
    )


def test_a_changed_file_gives_new_connections_a_new_context_at_the_next_check() -> None:
    files, build, now = FakeFiles(cert=(1, 10, 7), key=(1, 20, 8)), Builder(), [100.0]
    tls = _reloader(files, build, now)
    first = tls.current()
    assert first is build.built[0] and tls.reloads == 0
    files.files["/cert"] = (2, 10, 9)  # renamed over: new inode and mtime
    now[0] = 104.9
    assert tls.current() is first  # not checked yet: within check_every_s
    now[0] = 105.0
    renewed = tls.current()
    assert renewed is build.built[1] and tls.reloads == 1
    now[0] = 200.0
    assert tls.current() is renewed and len(build.built) == 2  # unchanged: not rebuilt


def test_a_change_that_does_not_load_keeps_the_old_context_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    files, build, now = FakeFiles(cert=(1, 10, 7), key=(1, 20, 8)), Builder(), [0.0]
    tls = _reloader(files, build, now, every_s=1.0)
    first = tls.current()
    # The certificate is replaced, its key not yet: they do not match.
    build.broken = ConfigError("tls.cert_file", "cannot load: key values mismatch")
    files.files["/cert"] = (2, 11, 9)
    with caplog.at_level(logging.WARNING, logger="taskserver.tls"):
        for t in (1.0, 2.0, 3.0):
            now[0] = t
            assert tls.current() is first
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "test listener" in warnings[0] and "key values mismatch" in warnings[0]
    assert "keep the previous certificate" in warnings[0]
    # The key arrives: the next check loads the pair.
    build.broken = None
    files.files["/key"] = (3, 21, 10)
    now[0] = 4.0
    assert tls.current() is build.built[1] and tls.reloads == 1


def test_a_file_missing_for_a_moment_is_a_change_and_keeps_the_old_context() -> None:
    files, build, now = FakeFiles(cert=(1, 10, 7), key=(1, 20, 8)), Builder(), [0.0]
    tls = _reloader(files, build, now, every_s=1.0)
    first = tls.current()
    del files.files["/key"]
    build.broken = ConfigError("tls.cert_file", "cannot load: No such file or directory")
    now[0] = 1.0
    assert tls.current() is first
    files.files["/key"] = (5, 20, 11)
    build.broken = None
    now[0] = 2.0
    assert tls.current() is build.built[1]


def test_the_listening_context_hands_each_handshake_the_newest_context() -> None:
    files, build, now = FakeFiles(cert=(1, 10, 7), key=(1, 20, 8)), Builder(), [0.0]
    tls = _reloader(files, build, now, every_s=1.0)
    listening = tls.listening()
    assert listening is tls.listening() is build.built[0]
    assert listening.sni_callback is not None

    class Handshake:  # what OpenSSL's servername callback gets: an SSLObject
        context = listening

    hs = Handshake()
    listening.sni_callback(hs, None, listening)  # type: ignore[arg-type]
    assert hs.context is listening  # nothing changed
    files.files["/cert"] = (2, 10, 9)
    now[0] = 1.0
    listening.sni_callback(hs, None, listening)  # type: ignore[arg-type]
    assert hs.context is build.built[1]


def test_the_first_build_fails_loudly() -> None:
    build = Builder()
    build.broken = ConfigError("tls.cert_file", "cannot load '/cert': No such file or directory")
    with pytest.raises(ConfigError, match=r"tls\.cert_file: cannot load"):
        _reloader(FakeFiles(), build, [0.0])


# -- the [tls] table -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"links": True}, "cert_file: TLS is on"),
        ({"http": True, "cert_file": "c"}, "cert_file: give cert_file and key_file together"),
        ({"cert_file": "c", "key_file": "k", "client_auth": "required"},
         "client_auth: 'required' applies to TLS links: set links = true"),
        ({"links": True, "cert_file": "c", "key_file": "k", "client_auth": "required"},
         "client_auth: checking peers' certificates needs ca_file"),
        ({"links": True, "cert_file": "c", "key_file": "k", "http_client_auth": "optional"},
         "http_client_auth: 'optional' applies to the HTTP API over TLS: set http = true"),
        ({"cert_file": "  ", "key_file": "k"}, "cert_file: must be a non-empty string"),
        ({"reload_check_s": 0.0}, "reload_check_s: must be > 0"),
    ],
)  # fmt: skip
def test_bad_tls_tables_are_refused_naming_the_key(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TlsConfig(**fields)


def test_the_loader_shares_tls_with_every_role_and_resolves_paths_against_the_file(
    tmp_path: Path,
) -> None:
    data = {
        "tls": {
            "links": True,
            "http": True,
            "cert_file": "pki/gw.pem",
            "key_file": "pki/gw.key",
            "ca_file": "/etc/cluster/ca.pem",
            "client_auth": "required",
            "http_client_auth": "optional",
            "server_name": "taskserver.cluster",
        }
    }
    cfg = parse_config(data, str(tmp_path / "tailgate.toml"))
    tls = cfg.gateway.tls
    assert tls == cfg.taskserver.tls
    assert tls.cert_file == str(tmp_path / "pki/gw.pem")
    assert tls.key_file == str(tmp_path / "pki/gw.key")
    assert tls.ca_file == "/etc/cluster/ca.pem"
    assert (tls.client_auth, tls.http_client_auth) == (ClientAuth.REQUIRED, ClientAuth.OPTIONAL)
    # `tailgate config` prints it once, at the top level, and reads back the same.
    text = dump_config(cfg)
    assert text.count("[tls]") == 1 and "[taskserver.tls]" not in text
    assert 'client_auth = "required"' in text
    again = parse_config(tomllib.loads(text), str(tmp_path / "again.toml"))
    assert again.gateway.tls == tls == again.taskserver.tls


def test_tls_errors_in_the_file_name_the_tls_key() -> None:
    with pytest.raises(ConfigError, match=r"tls\.client_auth: expected one of"):
        parse_config({"tls": {"client_auth": "maybe"}})
    with pytest.raises(ConfigError, match=r"tls\.cert_file: TLS is on"):
        parse_config({"tls": {"links": True}})
    with pytest.raises(ConfigError, match=r"gateway\.tls: give \[tls\] once"):
        parse_config({"tls": {}, "gateway": {"tls": {}}})


# -- command lines ---------------------------------------------------------------------------


def test_a_launcher_passes_tls_on_as_options_that_read_back_the_same() -> None:
    tls = TlsConfig(links=True, cert_file="/c.pem", key_file="/c.key", ca_file="/ca.pem",
                    client_auth=ClientAuth.REQUIRED)  # fmt: skip
    argv = tls_argv(tls)
    assert argv == ["--tls-cert", "/c.pem", "--tls-key", "/c.key", "--tls-ca", "/ca.pem",
                    "--tls-links", "--tls-client-auth", "required"]  # fmt: skip
    assert tls_argv(TlsConfig()) == []
    # An edge agent reads them (no config file): the same table.
    args = {"id": "pi-1", "cluster": "lab", "tls_cert": "/c.pem", "tls_key": "/c.key",
            "tls_ca": "/ca.pem", "tls_links": True, "tls_client_auth": "required"}  # fmt: skip
    assert load_agent_config(args, {}).tls == tls


def test_bad_tls_options_name_the_option() -> None:
    with pytest.raises(ValueError, match=r"^--tls-cert: give --tls-cert and --tls-key together"):
        with_tls_options(TlsConfig(), cert="/c.pem")
    with pytest.raises(ValueError, match=r"^--tls-client-auth: .* needs --tls-ca \(the cluster"):
        with_tls_options(TlsConfig(), cert="/c", key="/k", links=True, client_auth="required")
    with pytest.raises(AgentConfigError, match="--tls-client-auth: 'required' applies to TLS "
                       "links: set --tls-links"):  # fmt: skip
        load_agent_config(
            {"id": "pi-1", "cluster": "lab", "tls_cert": "/c", "tls_key": "/k",
             "tls_ca": "/ca", "tls_client_auth": "required"}, {},
        )  # fmt: skip


# -- what failures say -----------------------------------------------------------------------


def test_tls_failures_say_which_side_refused_what() -> None:
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_code, untrusted.verify_message = 20, "unable to get local issuer certificate"
    assert tls_problem(untrusted) == (
        "TLS: the peer's certificate is refused: unable to get local issuer certificate "
        "(is it issued by the CA in tls.ca_file?)"
    )
    wrong_host = ssl.SSLCertVerificationError(1, "certificate verify failed")
    wrong_host.verify_code = 64
    wrong_host.verify_message = "IP address mismatch, certificate is not valid for '10.0.0.9'"
    assert "or set tls.server_name" in (tls_problem(wrong_host) or "")
    refused = ssl.SSLError(1, "[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca")
    refused.reason = "TLSV1_ALERT_UNKNOWN_CA"
    assert "refuses this process's certificate" in (tls_problem(refused) or "")
    assert tls_problem(ssl.SSLEOFError(8, "EOF occurred")) == CLOSED_AT_HANDSHAKE
    assert tls_problem(ConnectionRefusedError(111, "refused")) is None
