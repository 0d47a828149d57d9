"""--unified-chat-template: both template files of the export carry the base's processor template in its
canonical form (reasoning rendered trimmed), so a request with or without tools renders one reasoning form;
the marker records it; verification checks the two files by rule; the option is part of the identity; a base
whose loaders would prefer another template is refused by the preflight, with or without --no-verify."""

from __future__ import annotations

import json
import shutil

import pytest
from materialize_helpers import (
    DEFAULTS,
    PROCESSOR_TEMPLATE,
    cli_args,
    cli_env,
    copy_tree,
    siblings,
    unified_base,
)

from ckptflow.conversion import verify_output
from ckptflow.conversion.chat_template import canonical
from ckptflow.digest import sha256_bytes
from ckptflow.errors import Refused, VerificationFailed
from ckptflow.jsonio import validate
from ckptflow.materialize import materialize
from ckptflow.records import materialized as marker
from helpers import tiny_models as tm
from helpers.cli import run_cli
from helpers.trees import tree_bytes

KIND = "qwen2_5_vl"
FAMILY = "REFUSED before anything is published: "
MESSAGES = [
    {"role": "user", "content": "plan the answer"},
    {"role": "assistant", "reasoning_content": "\n  step one, step two  \n", "content": "done"},
    {"role": "user", "content": "again"},
]
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "look a word up",
                                           "parameters": {"type": "object", "properties": {}}}}]
TRIMMED = "<think>\nstep one, step two\n</think>\n\n"


def request(models, out, base, **kw):
    return materialize(ckpt_dir=models.artifact(KIND), base=base, out=out, **{**DEFAULTS, **kw})


@pytest.fixture(scope="module")
def ubase(models, tmp_path_factory):
    return unified_base(models.base(KIND), tmp_path_factory.mktemp("unified") / "base")


@pytest.fixture(scope="module")
def published(models, ubase, tmp_path_factory):
    """A unified export of ``ubase``, built once; tests copy it."""
    out = tmp_path_factory.mktemp("unified-out") / "teacher"
    assert request(models, out, ubase, unified_chat_template=True).status == "built"
    return out


def loaded_render(model_dir, tools) -> str:
    """What ``AutoTokenizer`` of ``model_dir`` renders with its own template."""
    from transformers import AutoTokenizer

    with tm.quiet_transformers():
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    return tok.apply_chat_template(MESSAGES, tools=tools, tokenize=False)


def processor_render(model_dir, tools) -> str:
    """What the processor template of ``model_dir`` (chat_template.json) renders, through the same tokenizer
    (AutoProcessor itself needs torchvision, which this environment does not have)."""
    from transformers import AutoTokenizer

    template = json.loads((model_dir / "chat_template.json").read_text(encoding="utf-8"))["chat_template"]
    with tm.quiet_transformers():
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    return tok.apply_chat_template(MESSAGES, tools=tools, chat_template=template, tokenize=False)


def without_template(path) -> dict:
    obj = json.loads(path.read_text(encoding="utf-8"))
    obj.pop("chat_template")
    return obj


def test_the_base_renders_two_reasoning_forms_the_unified_export_one_with_and_without_tools(ubase, published):
    # The base: its processor template renders the reasoning one way with tools, another without, and its
    # tokenizer template is another template altogether (no tools section).
    assert processor_render(ubase, None) != processor_render(ubase, TOOLS).replace(
        "<|im_start|>system\n# Tools\n<|im_end|>\n", "")
    assert TRIMMED not in processor_render(ubase, TOOLS)
    assert loaded_render(ubase, TOOLS) != processor_render(ubase, TOOLS)

    for tools in (None, TOOLS):
        text = loaded_render(published, tools)
        assert text.count(TRIMMED) == 1, text  # the reasoning rendered trimmed
        assert text == processor_render(published, tools)  # tokenizer and processor templates agree
    assert loaded_render(published, TOOLS) == ("<|im_start|>system\n# Tools\n<|im_end|>\n"
                                               + loaded_render(published, None))


def test_only_the_chat_template_value_changes_and_the_marker_records_shas_and_one_hunk_diffs(ubase, published):
    record = marker.read_materialized(published)
    assert record.options == {"max_shard_bytes": DEFAULTS["max_shard_bytes"], "unified_chat_template": True}
    rec = record.chat_template
    assert rec["processor_template_sha256"] == sha256_bytes(PROCESSOR_TEMPLATE.encode())
    assert rec["canonical_sha256"] == sha256_bytes(canonical(PROCESSOR_TEMPLATE).encode())
    assert rec["allowed_sidecars"] == []
    assert [f["path"] for f in rec["files"]] == ["chat_template.json", "tokenizer_config.json"]
    for entry in rec["files"]:
        name = entry["path"]
        base_text = (ubase / name).read_text(encoding="utf-8")
        out_text = (published / name).read_text(encoding="utf-8")
        assert entry["base_sha256"] == sha256_bytes((ubase / name).read_bytes())
        assert entry["sha256"] == sha256_bytes((published / name).read_bytes())
        assert json.loads(out_text)["chat_template"] == canonical(PROCESSOR_TEMPLATE)
        assert without_template(published / name) == without_template(ubase / name)  # every other key
        old, new = base_text.splitlines(), out_text.splitlines()
        changed = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
        assert len(changed) == 1 and new[changed[0]].lstrip().startswith('"chat_template": ')
        diff = entry["diff"].splitlines()
        assert [line for line in diff if line.startswith("@@")] == [f"@@ -{changed[0] + 1},1 +{changed[0] + 1},1 @@"]
        assert diff[-2:] == ["-" + old[changed[0]], "+" + new[changed[0]]]
    # Every other file is the base's, byte for byte.
    for name in ("tokenizer.json", "preprocessor_config.json", "generation_config.json", "config.json"):
        assert (published / name).read_bytes() == (ubase / name).read_bytes()


def test_the_canonical_form_trims_every_reasoning_reference_and_is_a_fixed_point():
    form = canonical(PROCESSOR_TEMPLATE)
    assert "(message['reasoning_content'] | trim)" in form
    assert "message['reasoning_content'] +" not in form and ".strip(" not in form
    assert canonical(form) == form
    assert canonical(tm.CHAT_TEMPLATE) == tm.CHAT_TEMPLATE.replace(
        "message['reasoning_content'] | trim", "(message['reasoning_content'] | trim)")
    conditions = "{%- if message.get('reasoning_content') %}x{% endif %}{{ my_reasoning_content }}"
    assert canonical(conditions) == conditions  # only the rendered reasoning changes


def test_verification_checks_the_two_files_by_rule_and_a_damaged_one_is_rebuilt(models, ubase, published, tmp_path):
    out = copy_tree(published, tmp_path / "teacher")
    summary = verify_output(out, ubase, None, min_tensors=1, verify_tensors=False, unified_chat_template=True)
    assert "unified_chat_template" in summary.checks
    with pytest.raises(VerificationFailed, match=r"chat_template\.json differs from the base"):
        verify_output(out, ubase, None, min_tensors=1, verify_tensors=False)  # byte identity refuses it
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["model_max_length"] = 999  # another key changed: not the rule
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    with pytest.raises(VerificationFailed, match=r"tokenizer_config\.json is not the base"):
        verify_output(out, ubase, None, min_tensors=1, verify_tensors=False, unified_chat_template=True)
    result = request(models, out, ubase, unified_chat_template=True)
    assert result.status == "built" and result.reason.startswith("rebuilt: ")
    assert tree_bytes(out) == tree_bytes(published)


@pytest.mark.slow
def test_the_option_is_part_of_the_identity_both_ways_until_force(models, ubase, published, tmp_path):
    out = copy_tree(published, tmp_path / "teacher")
    before = tree_bytes(out)
    with pytest.raises(Refused, match="option unified_chat_template True -> None"):
        request(models, out, ubase)
    assert tree_bytes(out) == before and siblings(out) == []
    plain = request(models, out, ubase, force=True)
    assert plain.status == "built" and marker.read_materialized(out).chat_template is None
    assert (out / "tokenizer_config.json").read_bytes() == (ubase / "tokenizer_config.json").read_bytes()
    before = tree_bytes(out)
    proc = run_cli(*cli_args(models.artifact(KIND), ubase, out, "--unified-chat-template"), env=cli_env())
    assert proc.returncode == 1 and "option unified_chat_template None -> True" in proc.stderr, proc.stderr
    assert tree_bytes(out) == before
    proc = run_cli(*cli_args(models.artifact(KIND), ubase, out, "--unified-chat-template", "--force"), env=cli_env())
    assert proc.returncode == 0, proc.stderr
    report = proc.report
    validate(report, "report_materialize", what="materialize report")
    assert report["options"]["unified_chat_template"] is True
    assert report["chat_template"] == marker.read_materialized(out).chat_template
    assert tree_bytes(out) == tree_bytes(published)


def prefer(base, kind: str) -> str:
    """Give ``base`` a template a loader prefers; returns the name the refusal must give."""
    if kind == "jinja":
        (base / "chat_template.jinja").write_text(tm.CHAT_TEMPLATE, encoding="utf-8")
        return str(base / "chat_template.jinja")
    if kind == "template-dir-empty":
        (base / "additional_chat_templates").mkdir()
        return str(base / "additional_chat_templates")
    if kind == "template-dir":
        (base / "additional_chat_templates").mkdir()
        (base / "additional_chat_templates" / "tool_use.jinja").write_text(canonical(PROCESSOR_TEMPLATE))
        return str(base / "additional_chat_templates")
    if kind == "processor-config":
        (base / "processor_config.json").write_text(json.dumps({"chat_template": PROCESSOR_TEMPLATE}))
        return str(base / "processor_config.json")
    if kind == "tokenizer-config-no-key":
        config = json.loads((base / "tokenizer_config.json").read_text(encoding="utf-8"))
        del config["chat_template"]
        (base / "tokenizer_config.json").write_text(json.dumps(config))
        return str(base / "tokenizer_config.json")
    if kind == "no-chat-template-json":
        (base / "chat_template.json").unlink()
        return "chat_template.json"
    raise AssertionError(kind)


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
@pytest.mark.parametrize("kind", ["jinja", "template-dir-empty", "template-dir", "processor-config",
                                  "tokenizer-config-no-key", "no-chat-template-json"])
def test_a_base_whose_loaders_prefer_another_template_is_refused_by_name(models, ubase, published, tmp_path,
                                                                         kind, verify):
    base = copy_tree(ubase, tmp_path / "base")
    out = copy_tree(published, tmp_path / "teacher")
    before = tree_bytes(out)
    named = prefer(base, kind)
    with pytest.raises(Refused) as err:
        request(models, out, base, unified_chat_template=True, force=True, verify_tensors=verify)
    message = str(err.value)
    assert message.startswith(FAMILY) and named in message and "--unified-chat-template" in message, message
    assert tree_bytes(out) == before and siblings(out) == []


def test_the_tiny_vlm_base_itself_is_refused_for_its_chat_template_jinja(models, tmp_path):
    proc = run_cli(*cli_args(models.artifact(KIND), models.base(KIND), tmp_path / "teacher", "--unified-chat-template",
                             "--no-verify"), env=cli_env())
    assert proc.returncode == 1 and proc.report["status"] == "refused", proc.stderr
    assert FAMILY in proc.stderr and "additional_chat_templates" in proc.stderr
    assert not (tmp_path / "teacher").exists()
    base = copy_tree(models.base(KIND), tmp_path / "base")
    shutil.rmtree(base / "additional_chat_templates")
    with pytest.raises(Refused, match=r"chat_template\.jinja holds another template"):
        request(models, tmp_path / "teacher", base, unified_chat_template=True)


def test_sidecars_equal_to_the_canonical_template_are_allowed_and_recorded(models, ubase, tmp_path):
    base = copy_tree(ubase, tmp_path / "base")
    form = canonical(PROCESSOR_TEMPLATE)
    (base / "chat_template.jinja").write_text(form, encoding="utf-8")
    (base / "processor_config.json").write_text(json.dumps({"chat_template": form, "processor_class": "X"}) + "\n")
    out = tmp_path / "teacher"
    result = request(models, out, base, unified_chat_template=True)
    assert result.status == "built"
    assert result.record.chat_template["allowed_sidecars"] == [
        {"path": "chat_template.jinja", "sha256": sha256_bytes((base / "chat_template.jinja").read_bytes())},
        {"path": "processor_config.json", "sha256": sha256_bytes((base / "processor_config.json").read_bytes())},
    ]
    for name in ("chat_template.jinja", "processor_config.json"):
        assert (out / name).read_bytes() == (base / name).read_bytes()
    for tools in (None, TOOLS):  # the tokenizer now reads the .jinja: the same canonical template
        assert loaded_render(out, tools).count(TRIMMED) == 1


@pytest.mark.slow
def test_recovery_gives_the_two_files_their_unified_bytes_again(models, ubase, published, tmp_path):
    out = tmp_path / "teacher"
    proc = run_cli(*cli_args(models.artifact(KIND), ubase, out, "--unified-chat-template"),
                   env=cli_env(CKPTFLOW_TEST_KILL_AT="materialize:after-marker"))
    assert proc.returncode == -9, proc.stderr
    [left] = [out.parent / n for n in siblings(out) if n.startswith("teacher.tmp.")]
    for name in ("tokenizer_config.json", "chat_template.json"):  # as if the rewrite had not reached its rename
        shutil.copyfile(ubase / name, left / name)
    (left / ".tokenizer_config.json.host.1.0a1b2c3d.writing").write_text("{")  # and its temporary were left
    result = request(models, out, ubase, unified_chat_template=True)
    assert result.status == "built" and result.recovered == str(left)
    assert tree_bytes(out) == tree_bytes(published)
    assert siblings(out) == []
