"""``ckptflow materialize``: build the Hugging Face teacher directory of an artifact; see ``materialize/``."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ..conversion import DEFAULT_MIN_TENSORS
from ..errors import UsageError
from ..lock import DEFAULT_WAIT_SECONDS
from . import require_extra, wait_seconds_arg
from .summary import block, files_bytes, human_bytes, plural

_SIZE_RE = re.compile(r"^\s*([0-9]+)\s*([KMGT]i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def register(sub) -> None:
    s = sub.add_parser("materialize", help="build the Hugging Face model directory (OPD teacher) of an artifact")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt-dir", metavar="DIR", help="a local artifact (checkpoint_artifacts/iter_N of a trainer or merge)")
    src.add_argument("--artifact-uri", metavar="URI",
                     help="an archived artifact: s3://B/.../checkpoint_artifacts/iter_N (also gs://, file://); "
                     "fetched only when a build is needed")
    s.add_argument("--base", metavar="HF_DIR",
                   help="the Hugging Face base directory (config, index, sidecars); for a LoRA artifact the model it "
                   "was trained on; not used for a Hugging Face Trainer artifact of a full fine-tune (required otherwise)")
    s.add_argument("--out", required=True, metavar="DIR", help="the teacher directory; built beside it and renamed into place")
    s.add_argument("--expect-tensors", type=int, default=0, metavar="N", help="exact tensor count required (default 0: any)")
    s.add_argument("--min-tensors", type=int, default=DEFAULT_MIN_TENSORS, metavar="N",
                   help=f"tensor floor, checked before any build (default {DEFAULT_MIN_TENSORS})")
    s.add_argument("--no-verify", action="store_true",
                   help="skip only the bitwise tensor probes; index, key coverage, config and sidecar checks still run")
    s.add_argument("--force", action="store_true",
                   help="rebuild even over a completed output of another source, base, options or conversion version "
                   "(never over a directory ckptflow did not build, nor over files in it that no build writes)")
    s.add_argument("--stage-dir", metavar="DIR", help="where an archived artifact (--artifact-uri, or the archive a --ckpt-dir's receipt "
                   "names once its model.pt was pruned) is fetched (default <out>.stage): DIR/iter_N "
                   "when kept or already there, else a private DIR.<host>.<pid>.<token> removed afterwards")
    s.add_argument("--keep-staged", action="store_true", help="keep the fetched artifact this run staged")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS (unused for file://)")
    s.add_argument("--max-shard-size", default="5GB", metavar="BYTES",
                   help="largest tensor data per shard: bytes, or with KB/MB/GB/KiB/MiB/GiB (default 5GB); part of the identity")
    s.add_argument("--unified-chat-template", action="store_true",
                   help="ship the base's processor template (chat_template.json) in its canonical form, the reasoning "
                   "rendered trimmed, as the chat_template of both tokenizer_config.json and chat_template.json "
                   "(every other key unchanged); refuses a base with a template a loader prefers (chat_template.jinja, "
                   "additional_chat_templates/, processor_config.json's chat_template); part of the identity")
    s.add_argument("--lock-wait-seconds", type=wait_seconds_arg, default=DEFAULT_WAIT_SECONDS, metavar="S",
                   help="how long to wait for another materialize of the same --out (<out>.lock) before refusing "
                   f"(default {DEFAULT_WAIT_SECONDS:g}; a finite number >= 0)")
    s.set_defaults(func=run)


def parse_size(text: str) -> int:
    m = _SIZE_RE.match(text)
    if not m:
        raise UsageError(f"--max-shard-size {text!r} is not a size", remedy="write bytes, e.g. 5000000000 or 5GB or 4GiB")
    value = int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if value <= 0:
        raise UsageError(f"--max-shard-size must be positive, got {text!r}")
    return value


def run(args: argparse.Namespace) -> dict[str, Any]:
    require_extra("materialize", "convert")
    from ..materialize import materialize
    from ..store.open import credentials_for

    # A --ckpt-dir whose model.pt was pruned is read from its receipt's destinations: loaded for each one's scheme.
    credentials = credentials_for(args.artifact_uri, args.credentials) if args.artifact_uri is not None else args.credentials
    result = materialize(
        base=args.base, out=args.out, ckpt_dir=args.ckpt_dir, artifact_uri=args.artifact_uri,
        expect_tensors=args.expect_tensors, min_tensors=args.min_tensors, verify_tensors=not args.no_verify,
        force=args.force, stage_dir=args.stage_dir, keep_staged=args.keep_staged,
        max_shard_bytes=parse_size(args.max_shard_size), lock_wait_seconds=args.lock_wait_seconds,
        unified_chat_template=args.unified_chat_template,
        credentials=credentials,
    )
    return result.to_report()


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    shards = report["shards"]
    trainer = report["options"].get("trainer_artifact")  # a teacher from a Trainer artifact: its marker lists every file
    what = (f"{plural(report['tensor_count'], 'tensor')} in {plural(len(shards), 'file' if trainer else 'shard')}, "
            f"{human_bytes(sum(s['size'] for s in shards))}")
    if report["status"] == "built":
        headline = f"built the Hugging Face model: {what}"
    else:
        headline = f"already built: the same request's output is intact ({what})"
    src, ver, fetched, staging = report["source"], report["verification"], report["fetch"], report["staging"]
    checks = None
    if ver is not None:
        probed = len(ver["probed"]) + len(ver["probed_experts"])
        tensors = f"{plural(probed, 'tensor')} compared bitwise" if ver["tensors_verified"] else "no tensor compared (--no-verify)"
        if trainer and ver["tensors_verified"]:
            tensors = "every tensor compared bitwise" + (" with PEFT's merge" if trainer == "lora" else "")
        checks = f"{plural(len(ver['checks']), 'check')} passed, {tensors}"
    return block(headline, [
        ("out", report["out"]),
        ("from", f"{src['location']} (model.pt {human_bytes(src['size'])})" if not trainer else
            f"{src['location']} (Trainer artifact: {human_bytes(src['size'])} of "
            f"{'model' if trainer == 'full' else 'adapter'} files)"),
        ("why", report["reason"]),
        ("verified", checks),
        ("fetched", None if fetched is None else
            f"{fetched['status']}: {files_bytes(len(fetched['downloaded']), fetched['downloaded_bytes'])} downloaded"),
        ("staged", staging["path"] if staging and staging["kept"] else None),
    ], elapsed)
