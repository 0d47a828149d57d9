#!/usr/bin/env bash
# `make demo`: the main job on an embedded SeaweedFS S3 server (127.0.0.1, data under .ckptflow/demo).
# Builds a small synthetic artifact, seals it, qualifies the endpoint, publishes it, verifies the remote
# copy, frees the local payloads, fetches the artifact back into a staging directory, and stops the
# server it started (also when a step fails).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=.venv/bin
ROOT=.ckptflow/demo
SERVER=$ROOT/server
UPLOAD_PREFIX=demo-project/demo-group/demo-run/20261129T000000Z/checkpoints
RUN=$ROOT/runs/demo-project/demo-group/demo-run/20261129T000000Z
ART=$RUN/checkpoint_artifacts/iter_000300
STAGE=$ROOT/stage
CREDS=$SERVER/credentials-seaweedfs.json
BUCKET=ckptflow-demo
export CKPTFLOW_CACHE_DIR=$ROOT/cache

say() { printf '\n== %s\n' "$*" >&2; }

# Start from nothing: a leftover server of an interrupted run is stopped (by PID) and its data removed.
$BIN/python tests/helpers/servers.py down --root "$SERVER" >/dev/null 2>&1 || true
rm -rf "$ROOT"
trap '$BIN/python tests/helpers/servers.py down --root "$SERVER" >/dev/null' EXIT
say "starting SeaweedFS on 127.0.0.1 (data: $SERVER)"
$BIN/python tests/helpers/servers.py up --only seaweedfs --profile demo --root "$SERVER" >/dev/null
$BIN/python - "$CREDS" "$BUCKET" <<'PY'
import sys
sys.path.insert(0, "tests/helpers")
import servers
servers.create_bucket(sys.argv[1], sys.argv[2])
PY

say "writing a synthetic artifact: a consolidated model.pt and a DCP optimizer shard directory"
mkdir -p "$ART/optim"
$BIN/python - "$ART" <<'PY'
import os, sys, torch
art = sys.argv[1]
g = torch.Generator().manual_seed(0)
net = {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(256, 128, generator=g).to(torch.bfloat16) for i in range(4)}
torch.save({"net": net}, os.path.join(art, "model.pt"))
for name in (".metadata", "__0_0.distcp", "__1_0.distcp"):
    with open(os.path.join(art, "optim", name), "wb") as fh:
        fh.write(os.urandom(256 * 1024))
PY

say "ckptflow seal: hash the components and commit the manifest last"
$BIN/ckptflow seal --artifact-dir "$ART" --iteration 300 model=model.pt optim=optim

say "ckptflow probe: does the endpoint enforce create-once?"
$BIN/ckptflow probe --bucket "$BUCKET" --prefix demo-project/demo-group --credentials "$CREDS"

say "ckptflow publish: declaration first, payloads, manifest last, then the local .uploaded receipt"
$BIN/ckptflow publish --artifact-dir "$ART" --upload-prefix "$UPLOAD_PREFIX" --bucket "$BUCKET" --credentials "$CREDS"

say "ckptflow publish again: nothing to upload, the remote copy is re-verified"
$BIN/ckptflow publish --artifact-dir "$ART" --upload-prefix "$UPLOAD_PREFIX" --bucket "$BUCKET" --credentials "$CREDS"

say "ckptflow verify: HEAD every archived object against the receipt"
$BIN/ckptflow verify --artifact-dir "$ART" --credentials "$CREDS"

say "ckptflow prune-verified: free the local payloads now that the remote copy is proven"
$BIN/ckptflow prune-verified --paths "$ART" --credentials "$CREDS"

say "ckptflow fetch: bring the artifact back, every file checked against the declaration as it lands"
ARTIFACT_URI="s3://$BUCKET/${UPLOAD_PREFIX%/checkpoints}/checkpoint_artifacts/iter_000300"
$BIN/ckptflow fetch --artifact-uri "$ARTIFACT_URI" --dst "$STAGE" --credentials "$CREDS"

say "done"
cat >&2 <<TXT
  artifact:        $ART
  manifest:        $ART/.posttrain-checkpoint-artifact.json
  receipt:         $ART/.uploaded   (payloads pruned; the archive holds them)
  archive:         $ARTIFACT_URI/
  fetched copy:    $STAGE/iter_000300   (its ownership record: .staged.json)
  probe record:    $CKPTFLOW_CACHE_DIR/probes/
  object store:    SeaweedFS data under $SERVER (stopped now; rerun \`make demo\` to start over)
TXT
