"""Verify a Hugging Face export against its base and its source checkpoint.

``verify_output(out_dir, base_dir, model_pt)`` runs, in this order, and raises ``VerificationFailed`` naming
the file and the fault at the first failure:

1. the export's index (strict JSON) and the **tensor floor**: at least ``min_tensors`` tensors (applied
   before any tensor verification; nothing else imposes a floor), exactly ``expect_tensors`` when > 0;
2. **index ↔ shard headers**: every key in exactly one shard, the shard holds exactly its keys, offsets
   contiguous, file length = 8 + header + data, safetensors itself opens it, ``metadata.total_size`` =
   the tensor bytes; no weight file beside them that the index does not list (a loader could prefer it);
3. **exact key coverage** against the base: the same keys with the same shapes and dtypes;
4. **config identity** and **sidecar identity**: ``config.json`` and every sidecar byte-identical to the base's,
   and no other visible file (hidden ``.*`` entries are ckptflow's markers); with ``unified_chat_template``
   ``tokenizer_config.json`` and ``chat_template.json`` are checked by rule instead (``chat_template.unify``:
   the base's file with its ``chat_template`` value replaced by the canonical processor template);
5. unless ``verify_tensors=False`` (``--no-verify``): the checkpoint is memory-mapped and planned against
   the base again (strict accounting), then a **bitwise probe** of sampled non-expert tensors (the embedding
   and the final tensors always among them) and, when the base has MoE experts, **sampled expert layout
   checks**: the checkpoint must then hold experts, and sampled expert tensors must equal the checkpoint's
   after (un)fusing and transposing. Bytes are compared from the memory-mapped shard, in blocks.
"""

from __future__ import annotations

import mmap
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import CkptflowError, VerificationFailed
from . import DEFAULT_MIN_TENSORS, chat_template, shards, sidecars
from .hf import plan_conversion
from .layout import LayoutPlan
from .shards import tensor_bytes
from .source import Base, open_checkpoint, read_base


@dataclass(frozen=True)
class VerificationSummary:
    tensor_count: int
    shard_count: int
    total_size: int
    checks: tuple[str, ...]  # names of the checks that passed, in order
    sidecars: tuple[str, ...]
    tensors_verified: bool  # False under verify_tensors=False (--no-verify)
    probed: tuple[str, ...] = ()  # non-expert tensors compared bitwise
    probed_experts: tuple[str, ...] = ()  # expert tensors compared bitwise
    tied: dict[str, str] = field(default_factory=dict)
    loaders: dict[str, str] = field(default_factory=dict)  # check_loaders: loader -> "ok" / "skipped: why"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("checks", "sidecars", "probed", "probed_experts"):
            out[key] = list(out[key])
        return out


def _fail(message: str, *, path: Path | None = None, remedy: str = "rebuild the export") -> VerificationFailed:
    return VerificationFailed(message, path=str(path) if path else None, remedy=remedy)


def verify_output(
    out_dir: Path,
    base_dir: Path,
    model_pt: Path | None,
    *,
    expect_tensors: int = 0,
    min_tensors: int = DEFAULT_MIN_TENSORS,
    verify_tensors: bool = True,
    probe_count: int = 32,
    expert_probe_count: int = 8,
    seed: int = 0,
    unified_chat_template: bool = False,
) -> VerificationSummary:
    """Check the export in ``out_dir`` (see the module doc); return what was checked."""
    out_dir, base_dir = Path(out_dir), Path(base_dir)
    index = _read_export_index(out_dir)
    check_tensor_count(out_dir, index, min_tensors=min_tensors, expect_tensors=expect_tensors)
    headers, data_bytes = check_index_headers(out_dir, index)
    try:
        base = read_base(base_dir)
    except CkptflowError as exc:
        raise _fail(f"base: {exc}", path=base_dir, remedy="fix or re-download the base") from None
    check_key_coverage(out_dir, index, headers, base)
    sidecars.check_identical(base.path, out_dir, ())  # config identity
    check_sidecar_identity(out_dir, index, base, unified_templates(base_dir) if unified_chat_template else None)
    checks = ["tensor_count", "index_headers", "key_coverage", "config_identity", "sidecar_identity"]
    if unified_chat_template:
        checks.append("unified_chat_template")
    summary: dict[str, Any] = {
        "tensor_count": len(index.weight_map),
        "shard_count": len(headers),
        "total_size": data_bytes,
        "sidecars": base.sidecars.files,
    }
    if not verify_tensors:
        return VerificationSummary(checks=tuple(checks), tensors_verified=False, **summary)
    if model_pt is None:
        raise ValueError("verify_output needs model_pt unless verify_tensors=False")
    probes = check_tensors(out_dir, index, headers, base, Path(model_pt), probe_count=probe_count,
                           expert_probe_count=expert_probe_count, seed=seed)
    return VerificationSummary(
        checks=tuple(checks + probes.checks), tensors_verified=True, probed=tuple(probes.probed),
        probed_experts=tuple(probes.probed_experts), tied=probes.tied, **summary,
    )


def check_loaders(out_dir: Path, summary: VerificationSummary) -> VerificationSummary:
    """6. (a staged build, before it is published) The transformers loaders a teacher uses load the export:
    ``AutoTokenizer``, ``GenerationConfig``, ``AutoImageProcessor`` where present; ``AutoProcessor`` only
    with torchvision (``sidecars.load_with_transformers``). Their verdicts depend on the installed
    transformers, not only on the files, so ``verify_output`` alone does not run them."""
    loaders = sidecars.load_with_transformers(out_dir)
    return replace(summary, checks=(*summary.checks, "loaders"), loaders=loaders)


def _read_export_index(out_dir: Path) -> shards.Index:
    try:
        index = shards.read_index(out_dir, what="export")
    except CkptflowError as exc:
        raise _fail(f"export index: {exc}", path=out_dir / shards.INDEX_NAME) from None
    if index.path.name != shards.INDEX_NAME:
        raise _fail(f"export {out_dir} has no {shards.INDEX_NAME}", path=out_dir)
    return index


def check_tensor_count(out_dir: Path, index: shards.Index, *, min_tensors: int, expect_tensors: int) -> None:
    """1. The tensor floor (``min_tensors``) and, when > 0, the exact count (``expect_tensors``)."""
    count = len(index.weight_map)
    if count < min_tensors:
        raise _fail(
            f"export {out_dir} has {count} tensors, fewer than the floor of {min_tensors} (--min-tensors)",
            path=index.path, remedy="check that the base is the full model, or lower --min-tensors",
        )
    if expect_tensors > 0 and count != expect_tensors:
        raise _fail(
            f"export {out_dir} has {count} tensors, --expect-tensors says {expect_tensors}",
            path=index.path, remedy="check the base and the checkpoint, or fix --expect-tensors",
        )


def check_index_headers(out_dir: Path, index: shards.Index) -> tuple[dict[str, shards.ShardHeader], int]:
    """2. Index and shard headers agree, ``total_size`` is the tensor bytes, no unlisted weight file.
    Returns the headers by shard name and the tensor bytes."""
    try:
        headers = shards.read_headers(out_dir, index)
    except CkptflowError as exc:
        raise _fail(f"export shards: {exc}", path=Path(exc.path) if exc.path else out_dir) from None
    data_bytes = sum(e.end - e.start for h in headers.values() for e in h.entries.values())
    if index.total_size != data_bytes:
        raise _fail(
            f"{index.path}: metadata.total_size is {index.total_size}, the shards hold {data_bytes} tensor bytes",
            path=index.path,
        )
    listed = set(index.shards()) | {shards.INDEX_NAME}
    stray = [n for n in shards.weight_file_names(out_dir) if n not in listed]
    if stray:
        raise _fail(
            f"export {out_dir} holds weight files its index does not list: {stray[:20]}",
            path=out_dir / stray[0], remedy="remove them or rebuild the export (a loader may prefer them)",
        )
    return headers, data_bytes


def check_key_coverage(out_dir: Path, index: shards.Index, headers: dict[str, shards.ShardHeader], base: Base) -> None:
    """3. Exactly the base's keys, with the base's shapes and dtypes."""
    base_infos = base.infos()
    out_infos = {k: h.entries[k].info for h in headers.values() for k in h.entries}
    missing = sorted(set(base_infos) - set(out_infos))
    extra = sorted(set(out_infos) - set(base_infos))
    differ = sorted(k for k in set(base_infos) & set(out_infos) if base_infos[k] != out_infos[k])
    if missing or extra or differ:
        raise _fail(
            f"export {out_dir} does not cover the base's tensors exactly: {len(missing)} missing {missing[:20]}, "
            f"{len(extra)} extra {extra[:20]}, {len(differ)} with another shape/dtype "
            f"{[f'{k}: {out_infos[k]} vs base {base_infos[k]}' for k in differ[:20]]}",
            path=index.path,
        )


def unified_templates(base_dir: Path) -> dict[str, bytes]:
    """The bytes the two template files of a unified export must hold (``chat_template.unify``)."""
    try:
        return chat_template.unify(base_dir).expected()
    except CkptflowError as exc:
        raise _fail(f"--unified-chat-template: {exc.message}", path=Path(exc.path) if exc.path else base_dir,
                    remedy=exc.remedy or "fix the base") from None


def check_sidecar_identity(out_dir: Path, index: shards.Index, base: Base,
                           expected: dict[str, bytes] | None = None) -> None:
    """4. Every sidecar byte-identical to the base's (those in ``expected``: those bytes), no other visible file."""
    sidecars.check_identical(base.path, out_dir, base.sidecars.files, expected)
    expected = {sidecars.CONFIG_NAME, shards.INDEX_NAME, *index.shards(), *base.sidecars.files}
    unexpected = sidecars.unexpected_files(out_dir, expected)
    if unexpected:
        raise _fail(
            f"export {out_dir} holds files the base does not have: {unexpected[:20]}",
            path=out_dir / unexpected[0].rstrip("/"), remedy="remove them or rebuild the export (loaders may read them)",
        )


@dataclass
class TensorProbes:
    checks: list[str]
    probed: list[str]
    probed_experts: list[str]
    tied: dict[str, str]


def check_tensors(out_dir: Path, index: shards.Index, headers: dict[str, shards.ShardHeader], base: Base,
                  model_pt: Path, *, probe_count: int, expert_probe_count: int, seed: int) -> TensorProbes:
    """5. Strict accounting of the checkpoint against the base, then the bitwise and expert layout probes."""
    try:
        checkpoint = open_checkpoint(model_pt)
        plan, _mapper = plan_conversion(checkpoint, base)
    except CkptflowError as exc:
        raise _fail(f"checkpoint against base: {exc}", path=model_pt, remedy="rebuild the export from the right checkpoint and base") from None
    checks = ["checkpoint_accounting"]
    rng = random.Random(seed)
    plain = [k for k, d in plan.targets.items() if d.form == "plain"]
    expert = [k for k, d in plan.targets.items() if d.form != "plain"]
    probed = _sample(plain, probe_count, rng)
    probed_experts: list[str] = []
    with _ShardBytes(out_dir, headers, index) as out_bytes:
        for key in probed:
            _compare(plan, key, checkpoint.tensors.__getitem__, out_bytes, what="tensor")
        checks.append("bitwise_probe")
        if base.has_experts():
            if not any(d.form != "plain" for d in plan.sources.values()):
                raise _fail(
                    f"the base's index has MoE experts but checkpoint {model_pt} has none",
                    path=model_pt, remedy="convert the checkpoint of this MoE model",
                )
            probed_experts = _sample(expert, expert_probe_count, rng)
            for key in probed_experts:
                _compare(plan, key, checkpoint.tensors.__getitem__, out_bytes, what="expert tensor")
            checks.append("expert_layout")
    return TensorProbes(checks, probed, probed_experts, dict(plan.tied))


def _sample(keys: list[str], n: int, rng: random.Random) -> list[str]:
    """Embeddings, output head, first, last and a seeded sample of the rest, in order (all when few)."""
    if len(keys) <= n:
        return list(keys)
    fixed = {keys[0], keys[-1]} | {k for k in keys if "embed_tokens" in k or k.startswith("lm_head")}
    rest = [k for k in keys if k not in fixed]
    chosen = fixed | set(rng.sample(rest, max(0, n - len(fixed))))
    return [k for k in keys if k in chosen]


class _ShardBytes:
    """Memory-mapped byte ranges of the export's tensors."""

    def __init__(self, out_dir: Path, headers: dict[str, shards.ShardHeader], index: shards.Index):
        self._headers = headers
        self._index = index
        self._out = out_dir
        self._maps: dict[str, tuple[Any, mmap.mmap, memoryview]] = {}

    def __enter__(self) -> _ShardBytes:
        return self

    def __exit__(self, *exc: object) -> None:
        for fh, mm, view in self._maps.values():
            view.release()
            mm.close()
            fh.close()

    def get(self, key: str) -> tuple[Path, memoryview]:
        """The tensor's bytes in the shard; the caller releases the returned view."""
        shard = self._index.weight_map[key]
        header = self._headers[shard]
        if shard not in self._maps:
            fh = open(header.path, "rb")  # closed in __exit__
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[shard] = (fh, mm, memoryview(mm))
        entry = header.entries[key]
        return header.path, self._maps[shard][2][header.data_start + entry.start : header.data_start + entry.end]


def _compare(plan: LayoutPlan, key: str, get_tensor, out_bytes: _ShardBytes, *, what: str, block: int = 16 << 20) -> None:
    path, actual = out_bytes.get(key)
    pos = 0
    try:
        for chunk in plan.chunks(key, get_tensor):
            expected = tensor_bytes(chunk)
            n = expected.nbytes
            for off in range(0, n, block):
                end = min(off + block, n)
                want, got = bytes(expected[off:end]), bytes(actual[pos + off : pos + end])
                if want != got:
                    first = pos + off + next(i for i, (x, y) in enumerate(zip(want, got, strict=True)) if x != y)
                    raise _fail(
                        f"{what} {key} in {path} differs from the checkpoint's bytes (first at byte {first})",
                        path=path, remedy="rebuild the export; the shard is corrupt or from another checkpoint",
                    )
            pos += n
            del expected, chunk
    finally:
        actual.release()
