"""The preflight: a damaged base is refused in one message family before anything is published, removed,
restored or written, and the existing output stays byte-identical."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from materialize_helpers import DEFAULTS, cli_args, cli_env, copy_tree, siblings

from ckptflow.errors import Refused
from ckptflow.materialize import materialize
from helpers import REPO
from helpers.cli import run_cli
from helpers.trees import tree_bytes

FAMILY = "REFUSED before anything is published: "


def request(models, out, base, *, seed: int = 1, **kw):
    return materialize(ckpt_dir=models.artifact("qwen3", seed), base=base, out=out, **{**DEFAULTS, **kw})


def first_shard(base):
    return base / sorted(set(json.loads((base / "model.safetensors.index.json").read_text())["weight_map"].values()))[0]


def damage(base, kind: str) -> str:
    """Damage the base copy; returns what the refusal must name."""
    if kind == "bom":
        (base / "tokenizer_config.json").write_bytes(b"\xef\xbb\xbf" + (base / "tokenizer_config.json").read_bytes())
        return "tokenizer_config.json starts with a UTF-8 byte-order mark"
    if kind == "tokenizer-config-not-object":
        (base / "tokenizer_config.json").write_text("[]")
        return "tokenizer_config.json must hold a JSON object"
    if kind == "chat-template-json-empty":
        (base / "chat_template.json").write_text(json.dumps({"chat_template": ""}))
        return "chat_template.json has no non-empty 'chat_template' string"
    if kind == "chat-template-json-missing-key":
        (base / "chat_template.json").write_text(json.dumps({"other": 1}))
        return "chat_template.json has no non-empty 'chat_template' string"
    if kind == "weight-map-empty":
        (base / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {}}))
        return "weight_map must be a non-empty object"
    if kind == "shard-missing":
        shard = first_shard(base)
        shard.unlink()
        return shard.name
    if kind == "shard-truncated":
        shard = first_shard(base)
        with open(shard, "r+b") as fh:
            fh.truncate(shard.stat().st_size - 1)
        return shard.name
    if kind == "jinja-not-utf8":
        (base / "chat_template.jinja").write_bytes(b"{{ messages }}\xff")
        return "chat_template.jinja is not valid UTF-8"
    if kind == "template-dir-not-files":
        (base / "additional_chat_templates" / "nested").mkdir(parents=True)
        return "nested is not a regular file"
    if kind == "base-missing":
        shutil.rmtree(base)
        return str(base)
    raise AssertionError(kind)


KINDS = ["bom", "tokenizer-config-not-object", "chat-template-json-empty", "chat-template-json-missing-key",
         "weight-map-empty", "shard-missing", "shard-truncated", "jinja-not-utf8", "template-dir-not-files",
         "base-missing"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_base_is_refused_in_one_family_and_the_output_stays_byte_identical(models, tmp_path, kind):
    base = copy_tree(models.base(), tmp_path / "base")
    out = tmp_path / "teacher"
    request(models, out, base)
    before, beside = tree_bytes(out), siblings(out)
    named = damage(base, kind)
    with pytest.raises(Refused) as err:
        request(models, out, base, seed=2, force=True)
    message = str(err.value)
    assert message.startswith(FAMILY) and named in message and "; the staged build" in message, message
    assert tree_bytes(out) == before and siblings(out) == beside


def test_the_tensor_floor_is_in_the_family(models, tmp_path):
    out = tmp_path / "teacher"
    with pytest.raises(Refused, match=FAMILY + r".*fewer than the floor of 800 \(--min-tensors\)"):
        request(models, out, models.base(), min_tensors=800)
    assert not out.exists() and siblings(out) == []


def test_too_little_free_space_for_two_exports_is_refused_by_name(models, tmp_path, monkeypatch):
    out = tmp_path / "teacher"
    request(models, out, models.base())
    before = tree_bytes(out)
    monkeypatch.setattr("ckptflow.materialize.preflight.free_bytes", lambda path: 1000)
    with pytest.raises(Refused, match=FAMILY + r".* has 1000 bytes free, the staged export of .* needs") as err:
        request(models, out, models.base(), seed=2, force=True)
    assert "second export beside the existing output" in str(err.value)
    assert tree_bytes(out) == before and siblings(out) == []


@pytest.mark.slow
def test_a_refused_preflight_restores_no_leftover_either(models, tmp_path):
    """Killed between the swap's renames, then a request on a damaged base: the old tree stays aside."""
    base = copy_tree(models.base(), tmp_path / "base")
    out = tmp_path / "teacher"
    request(models, out, base)
    proc = run_cli(*cli_args(models.artifact("qwen3", 2), base, out, "--force"),
                   env=cli_env(CKPTFLOW_TEST_KILL_AT="materialize:mid-swap"))
    assert proc.returncode == -9
    beside = {n: tree_bytes(out.parent / n) for n in siblings(out)}
    damage(base, "bom")
    proc = run_cli(*cli_args(models.artifact("qwen3", 2), base, out, "--force"))
    assert proc.returncode == 1 and FAMILY in proc.stderr and "byte-order mark" in proc.stderr, proc.stderr
    assert not out.exists() and {n: tree_bytes(out.parent / n) for n in siblings(out)} == beside


# The CLI in a child that says on its last stderr line whether torch was imported when it exited.
_TORCH_PROBE = """
import atexit, runpy, sys
atexit.register(lambda: sys.stderr.write("torch imported: %s\\n" % ("torch" in sys.modules)))
sys.argv = ["ckptflow", *sys.argv[1:]]
runpy.run_module("ckptflow", run_name="__main__", alter_sys=True)
"""


def run_probed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _TORCH_PROBE, *args], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=300)


@pytest.mark.parametrize("kind", ["shard-truncated", "bom", "unified-jinja"])
def test_a_preflight_refusal_happens_before_torch_is_imported(models, tmp_path, kind):
    base = copy_tree(models.base(), tmp_path / "base")
    out = tmp_path / "teacher"
    request(models, out, base)
    before = tree_bytes(out)
    more = []
    if kind == "unified-jinja":  # the tiny text base keeps its tokenizer template in chat_template.jinja
        more = ["--unified-chat-template", "--no-verify"]
        (base / "chat_template.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    else:
        damage(base, kind)
    proc = run_probed(*cli_args(models.artifact("qwen3", 2), base, out, "--force", *more))
    assert proc.returncode == 1 and FAMILY in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == "torch imported: False", proc.stderr
    assert tree_bytes(out) == before and siblings(out) == []


@pytest.mark.slow
def test_the_probe_sees_torch_once_a_request_builds_and_not_when_the_marker_decides(models, tmp_path):
    """The other side of the probe above: it does report torch (a build), and a request decided on the
    completed output's marker (refused here, or skipped) is decided on records alone, without torch."""
    out = tmp_path / "teacher"
    request(models, out, models.base())
    before = tree_bytes(out)
    proc = run_probed(*cli_args(models.artifact("qwen3", 2), models.base(), out))
    assert proc.returncode == 1 and "they differ in: source model.pt" in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == "torch imported: False", proc.stderr
    assert tree_bytes(out) == before

    proc = run_probed(*cli_args(models.artifact("qwen3", 2), models.base(), tmp_path / "another"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[-1] == "torch imported: True", proc.stderr


def _without_file_permission_override() -> list[str]:
    """A command prefix that runs the CLI without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so file modes
    bind it like an ordinary user (the tests run as root); [] where that cannot be done here."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return []
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "open('/proc/self/status').read()"], capture_output=True)
    return prefix if probe.returncode == 0 else []


@pytest.mark.parametrize("what", ["shard", "base-dir", "sidecar"])
def test_a_base_this_user_cannot_read_is_refused_by_name_with_the_reason(models, tmp_path, what):
    prefix = _without_file_permission_override()
    if not prefix:
        assert not os.environ.get("CI"), "setpriv cannot drop the file-permission override here"
        pytest.skip("setpriv is missing or cannot drop CAP_DAC_OVERRIDE here: no way to deny root a read")
    base = copy_tree(models.base(), tmp_path / "base")
    out = tmp_path / "teacher"
    request(models, out, base)
    before = tree_bytes(out)
    target = {"shard": first_shard(base), "base-dir": base, "sidecar": base / "tokenizer_config.json"}[what]
    mode = target.stat().st_mode
    target.chmod(0)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "ckptflow",
                               *cli_args(models.artifact("qwen3", 2), base, out, "--force")],
                              capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=300)
    finally:
        target.chmod(mode)
    assert proc.returncode == 1 and json.loads(proc.stdout)["status"] == "refused", proc.stderr
    assert FAMILY in proc.stderr and str(target) in proc.stderr and "Permission denied" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert tree_bytes(out) == before and siblings(out) == []
