"""`make s3-up` / `make s3-down`: a user's own SeaweedFS on free 127.0.0.1 ports (never the tests' or the
demo's fixed ones), its credentials file under S3_ROOT usable by ckptflow as it stands, stopped by PID."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, servers
from helpers.cli import run_cli

STAMP = ".venv/.ckptflow-installed"  # the Makefile's setup stamp: `-o` keeps make from reinstalling here


def _make(target: str, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO), "-o", STAMP, target,
                           f"S3_ROOT={root}"], capture_output=True, text=True, timeout=300)


def _listening(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} spell them) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.append(address)
    return found


def _ports_of(pid: int) -> list[int]:
    """Every ``-<service>.port=N`` on the server's command line (gRPC ports are N + GRPC_OFFSET)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return [int(arg.split("=", 1)[1]) for arg in argv if arg.split("=", 1)[0].endswith(".port")
            and arg.split("=", 1)[1] != "0"]


def test_a_drawn_profile_never_takes_a_port_of_the_tests_or_the_demo(tmp_path: Path):
    fixed = {port for p in servers.PROFILES.values() for port in (p.s3, p.master, p.volume, p.filer, p.s3rver, p.admin)}
    assert fixed | {port + servers.GRPC_OFFSET for port in fixed} <= servers.FIXED_PORTS
    secrets = set()
    for i in range(20):
        profile = servers.local_profile(tmp_path / str(i))
        drawn = {profile.s3, profile.master, profile.volume, profile.filer, profile.s3rver, profile.admin}
        assert not (drawn | {port + servers.GRPC_OFFSET for port in drawn}) & servers.FIXED_PORTS
        assert servers.local_profile(tmp_path / str(i)) == profile  # kept for the next start
        secrets.add(profile.secret_key)
    assert len(secrets) == 20  # random, not a fixed test key


@pytest.mark.slow
def test_s3_up_serves_s3_on_loopback_with_credentials_that_probe_passes_and_s3_down_stops_it(tmp_path: Path):
    root = tmp_path / "s3"
    up = _make("s3-up", root)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        entry = servers.read_state(root)["servers"]["seaweedfs"]
        assert servers.is_running(entry)
        ports = _ports_of(entry["pid"])
        assert entry["port"] in ports
        assert not ({*ports, *(p + servers.GRPC_OFFSET for p in ports)} & servers.FIXED_PORTS), ports
        assert _listening(entry["port"]) == ["0100007F"]  # 127.0.0.1 only
        creds = Path(entry["credentials"])
        assert creds.parent == root and creds.stat().st_mode & 0o777 == 0o600
        said = json.loads(creds.read_text(encoding="utf-8"))
        assert said["endpoint_url"] == f"http://127.0.0.1:{entry['port']}"
        assert f"CKPTFLOW_CREDENTIALS={creds}" in up.stderr and f"CKPTFLOW_BUCKET={entry['bucket']}" in up.stderr
        assert said["aws_secret_access_key"] not in up.stdout + up.stderr

        probe = run_cli("probe", "--bucket", entry["bucket"], "--prefix", "try", "--credentials", str(creds))
        assert probe.returncode == 0, probe.stdout + probe.stderr

        again = _make("s3-up", root)  # idempotent: the running server stays, on its ports
        assert again.returncode == 0, again.stdout + again.stderr
        assert servers.read_state(root)["servers"]["seaweedfs"] == entry

        down = _make("s3-down", root)
        assert down.returncode == 0, down.stdout + down.stderr
        assert down.stderr == f"stopped the local S3 on {entry['endpoint_url']} (PID {entry['pid']})\n", down.stderr
        assert not servers.is_running(entry)
        assert _listening(entry["port"]) == []
        assert not servers.state_path(root).exists()

        # A restart serves the same endpoint with the same credentials file: what the user exported holds.
        restart = _make("s3-up", root)
        assert restart.returncode == 0, restart.stdout + restart.stderr
        assert servers.read_state(root)["servers"]["seaweedfs"]["port"] == entry["port"]
        assert json.loads(creds.read_text(encoding="utf-8")) == said
    finally:
        down = _make("s3-down", root)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not servers.state_path(root).exists()
    again = _make("s3-down", root)  # nothing left to stop: said so, not an error
    assert again.returncode == 0 and again.stderr.startswith("no local S3 was running"), again.stderr


def _listener(port: int) -> socket.socket:
    """Another process's server on ``port`` of 127.0.0.1 (a listening socket; the kernel accepts for it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the stopped server's connections may linger
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


@pytest.mark.slow
def test_a_restart_with_a_port_taken_refuses_naming_it_and_keeps_the_endpoint_its_receipts_name(tmp_path: Path):
    root = tmp_path / "s3"
    art = tmp_path / "runs" / "proj" / "grp" / "run1" / "20261201T000000Z" / "checkpoint_artifacts" / "iter_000001"
    art.mkdir(parents=True)
    (art / "model.pt").write_bytes(b"weights" * 1000)
    assert run_cli("seal", "--artifact-dir", str(art), "--iteration", "1", "model=model.pt").returncode == 0
    up = _make("s3-up", root)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        entry = servers.read_state(root)["servers"]["seaweedfs"]
        creds = Path(entry["credentials"])
        said, kept = creds.read_text(encoding="utf-8"), (root / servers.LOCAL_PROFILE).read_text(encoding="utf-8")
        published = run_cli("publish", "--artifact-dir", str(art), "--bucket", entry["bucket"],
                            "--credentials", str(creds))
        assert published.returncode == 0, published.stderr
        assert _make("s3-down", root).returncode == 0
        profile = servers.Profile(**json.loads(kept))

        for port, named in ((profile.s3, f"{profile.s3} (s3)"),
                            (profile.master + servers.GRPC_OFFSET, f"{profile.master + servers.GRPC_OFFSET} (master gRPC)")):
            with _listener(port):
                refused = _make("s3-up", root)
                assert refused.returncode != 0, refused.stdout + refused.stderr
                line = refused.stderr.strip()
                assert f"port {named} on 127.0.0.1 is taken by another process" in line, line
                assert f"keeps its endpoint http://127.0.0.1:{profile.s3} and key" in line, line
                assert "run `make s3-up` again" in line and "S3_ROOT=<a new directory>" in line, line
                assert profile.secret_key not in refused.stdout + refused.stderr
                assert not servers.read_state(root)["servers"]  # nothing started
                assert creds.read_text(encoding="utf-8") == said  # the endpoint and key the user exported
                assert (root / servers.LOCAL_PROFILE).read_text(encoding="utf-8") == kept

        restart = _make("s3-up", root)  # the port is free again: the same endpoint, the same key, the same data
        assert restart.returncode == 0, restart.stdout + restart.stderr
        assert servers.read_state(root)["servers"]["seaweedfs"]["endpoint_url"] == entry["endpoint_url"]
        assert creds.read_text(encoding="utf-8") == said
        verified = run_cli("verify", "--artifact-dir", str(art), "--credentials", str(creds))
        assert verified.returncode == 0, verified.stderr  # the receipt's endpoint is the server's
    finally:
        assert _make("s3-down", root).returncode == 0


def test_a_data_directory_without_its_profile_is_never_given_a_new_endpoint(tmp_path: Path):
    root = tmp_path / "s3"
    (root / "seaweedfs" / "data").mkdir(parents=True)
    (root / "seaweedfs" / "data" / "1.dat").write_bytes(b"")
    with pytest.raises(servers.ServerError) as exc:
        servers.local_profile(root)
    assert f"{root / servers.LOCAL_PROFILE} (the ports and key its receipts name) is missing" in str(exc.value)
    assert "S3_ROOT=<a new directory>" in str(exc.value)
    assert not (root / servers.LOCAL_PROFILE).exists()
