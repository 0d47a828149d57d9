#!/usr/bin/env bash
# `make demo`: the main job, offline, on an embedded SeaweedFS S3 server (127.0.0.1, data under .ckptflow/demo).
# Builds a small real run (demo/build_run.py: a tiny trained Qwen3-MoE base, three experts, one trainer
# artifact with a DCP optimizer directory), seals it with `ckptflow seal`, qualifies the endpoint with
# `ckptflow probe`, then drives the Snakemake workflow with demo/config.yaml:
#   merge_experts -> publish_all -> verify_all -> prune_all -> materialize_teacher (from the archive) -> status
# checks that table (demo/check_status.py: every row committed, published, verified and pruned, else it
# fails) and loads the teacher with transformers for one greedy generation. Stops the server it started (also
# when a step fails); any failed step stops the demo with a non-zero status.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=.venv/bin
ROOT=.ckptflow/demo
SERVER=$ROOT/server
RUNS=$ROOT/runs
TS=20261129T000000Z
TEACHER_RUN=demo/teacher/tv-merge/$TS
CREDS=$SERVER/credentials-seaweedfs.json
BUCKET=ckptflow-demo
export CKPTFLOW_CACHE_DIR=$ROOT/cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

say() { printf '\n== %s\n' "$*" >&2; }
# snakemake TARGET [--config KEY=VALUE ...]: the target first, as --configfile and --config take lists.
smk() { say "snakemake $*"; "$BIN/snakemake" "$1" --cores 2 --quiet host rules --configfile demo/config.yaml "${@:2}"; }

# Start from nothing: a leftover server of an interrupted run is stopped (by PID) and its data removed;
# the lock an interrupted Snakemake left in .snakemake/ is released.
$BIN/python tests/helpers/servers.py down --root "$SERVER" >/dev/null 2>&1 || true
rm -rf "$ROOT"
"$BIN/snakemake" --unlock --configfile demo/config.yaml >/dev/null 2>&1 || true
trap '$BIN/python tests/helpers/servers.py down --root "$SERVER" >/dev/null' EXIT

say "building the run offline: a tiny Qwen3-MoE base (trained tokenizer, real config), three experts, a trainer artifact"
BUILT=$($BIN/python -W ignore demo/build_run.py "$ROOT")
printf '%s\n' "$BUILT" >"$ROOT/build.json"
$BIN/python - "$ROOT/build.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
print(f"  base:     {b['base']}  (trained to loss {b['base_loss']})", file=sys.stderr)
for name, e in b["experts"].items():
    print(f"  expert:   {e['model']}  ({name})", file=sys.stderr)
print(f"  trainer:  {b['trainer']['artifact_dir']}  (model.pt + DCP optim/)", file=sys.stderr)
print(f"  built in {b['seconds']} s", file=sys.stderr)
PY

say "ckptflow seal: hash each artifact's components and commit its manifest last"
for expert in storage transfer modeling; do
  $BIN/ckptflow seal --artifact-dir "$RUNS/demo/experts/$expert/$TS/checkpoint_artifacts/iter_000200" \
    --iteration 200 model=model.pt >/dev/null
done
$BIN/ckptflow seal --artifact-dir "$RUNS/demo/sft/trainer/$TS/checkpoint_artifacts/iter_000100" \
  --iteration 100 model=model.pt optim=optim

say "starting SeaweedFS on 127.0.0.1 (data: $SERVER)"
$BIN/python tests/helpers/servers.py up --only seaweedfs --profile demo --root "$SERVER" >/dev/null
$BIN/python - "$CREDS" "$BUCKET" <<'PY'
import sys
sys.path.insert(0, "tests/helpers")
import servers
servers.create_bucket(sys.argv[1], sys.argv[2])
PY

say "ckptflow probe: does the endpoint enforce create-once? (pruning requires a passing probe record)"
$BIN/ckptflow probe --bucket "$BUCKET" --prefix demo --credentials "$CREDS" >/dev/null

smk merge_experts --config iter=300 run="$TEACHER_RUN"
smk publish_all
smk verify_all
smk prune_all
say "the payloads are pruned; what is left locally:"
find "$RUNS" -path '*/checkpoint_artifacts/*' -type f | sort | sed 's/^/  /' >&2
smk materialize_teacher --config iter=300
smk status
TEACHER=$ROOT/teachers/$TEACHER_RUN/iter_000300
REPORTS=$ROOT/reports
say "checking the status table: every row committed, published, verified and pruned"
$BIN/python demo/check_status.py "$REPORTS/status.json"

say "the teacher: $TEACHER"
$BIN/python - "$REPORTS/materialize/$TEACHER_RUN/iter_000300.json" <<'PY'
import json, os, sys
built = json.load(open(sys.argv[1]))
fetch = built["fetch"]  # materialize fetched the archive itself, once it knew it had to build
print(f"  fetched:  {built['source']['location']} -> {os.path.relpath(fetch['path'])} ({fetch['downloaded_bytes']:,} bytes)", file=sys.stderr)
print(f"  built:    {built['status']}, {built['tensor_count']} tensors in {len(built['shards'])} shard(s), "
      f"checks: {', '.join(built['verification']['checks'])}", file=sys.stderr)
PY
ls -A "$TEACHER" | sed 's/^/  /' >&2
say "loading the teacher with transformers: one greedy generation"
$BIN/python -W ignore demo/generate.py "$TEACHER"

say "done in ${SECONDS} s"
cat >&2 <<TXT
  runs:            $RUNS   (status: $ROOT/reports/status.txt)
  teacher:         $TEACHER
  archive:         s3://$BUCKET/demo/   (SeaweedFS data under $SERVER)
  fetched copy:    $ROOT/stage/$TEACHER_RUN/iter_000300   (its ownership record: .staged.json)
  logs:            $ROOT/logs/
  object store:    stopped now; rerun \`make demo\` to start over
TXT
