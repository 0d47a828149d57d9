"""``ckptflow merge``: streaming average / task-vector merge of expert checkpoints into one artifact."""

from __future__ import annotations

import argparse
from typing import Any

from .. import __version__
from ..lock import DEFAULT_WAIT_SECONDS
from . import require_extra, wait_seconds_arg
from .summary import block, human_bytes, plural


def register(sub) -> None:
    s = sub.add_parser("merge", help="merge expert checkpoints (avg or task vector) into <...>/iter_N/model.pt")
    s.add_argument("--mode", required=True, choices=["avg", "tv"],
                   help="avg: uniform average; tv: base + lam * sum(expert - base)")
    s.add_argument("--experts", required=True, metavar="A,B,C",
                   help='comma-separated torch.save({"net": state_dict}) files; the order is part of the identity')
    s.add_argument("--out", required=True, metavar="<...>/iter_N/model.pt", help="the merged model; its directory is the artifact")
    s.add_argument("--base", metavar="HF_DIR", help="Hugging Face base directory (safetensors shards); --mode tv only")
    s.add_argument("--lam", type=float, metavar="F", help="task-vector scale (default 1.0); --mode tv only")
    s.add_argument("--iteration", type=int, metavar="N", help="must match the iter_N directory of --out")
    s.add_argument("--diag", metavar="PATH", help="write per-tensor delta diagnostics as JSON; --mode tv only")
    s.add_argument("--force", action="store_true",
                   help="replace a completed merge of a different request, an older tool's, or a foreign artifact")
    s.add_argument("--lock-wait-seconds", type=wait_seconds_arg, default=DEFAULT_WAIT_SECONDS, metavar="S",
                   help=f"wait up to S seconds for another merge of the same output (default {DEFAULT_WAIT_SECONDS:g})")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    require_extra("merge", "convert")
    from ..merge import merge_experts

    experts = [e.strip() for e in args.experts.split(",") if e.strip()]
    result = merge_experts(
        args.mode, experts, args.out, base=args.base, lam=args.lam, iteration=args.iteration, diag=args.diag,
        force=args.force, lock_wait_seconds=args.lock_wait_seconds,
    )
    return report(result)


def report(result) -> dict[str, Any]:
    req = result.request
    return {
        "status": result.status,
        "reason": result.reason,
        "out": str(result.out),
        "artifact_dir": str(result.artifact_dir),
        "iteration": req.iteration,
        "mode": req.mode,
        "lam": req.lam,
        "experts": [e.to_dict() for e in req.experts],
        "base": None if req.base is None else {"path": str(result.base_dir), **req.base.to_dict()},
        "request_identity": result.identity,
        "replaced_identity": result.replaced_identity,
        "model": result.model.to_dict(),
        "diag": str(result.diag) if result.diag is not None else None,
        "layout": result.layout,
        "inputs_normalised": result.inputs_normalised if result.status == "built" else None,
        "tensors": result.tensors,
        "removed_temporaries": result.removed_temporaries,
        "tool_version": __version__,
    }


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    method = "average" if report["mode"] == "avg" else f"task vector (lam {report['lam']})"
    model = f"model.pt {human_bytes(report['model']['size'])}"
    if report["status"] == "built":
        headline = (f"merged {plural(len(report['experts']), 'expert')} by {method} into iteration "
                    f"{report['iteration']}: {plural(report['tensors'], 'tensor')}, {model}")
    else:
        headline = f"already merged: iteration {report['iteration']}, the same request is complete and intact ({model})"
    return block(headline, [
        ("out", report["out"]),
        ("why", report["reason"]),
        ("base", report["base"]["path"] if report["base"] else None),
        ("layout", report["layout"]),
        ("diag", report["diag"]),
    ], elapsed)
