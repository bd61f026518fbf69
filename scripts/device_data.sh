#!/usr/bin/env bash
# Build the data the GPU machine cannot download: one folder per stage of scripts/gpu_reproduce.sh,
#
#   bash scripts/device_data.sh [STAGE...]      # default: jsb maestro genome text
#
# writes .device-data/STAGE/NAME/ (a prepared dataset: manifest.json, {split}.bin, {split}.docs.npy), i.e.
# .device-data/STAGE is a $POPE_DATA_DIR holding exactly the dataset that stage trains and evaluates on
# (jsb: jsb; maestro: maestro; genome: genome; text: text). Run it here, where the offline sources are
# (`pope data offline fetch`), then hand the stage's folder to the device with the run tool's carry option:
#
#   carry: [".device-data/jsb"]     command: STAGE=jsb bash scripts/gpu_reproduce.sh
#
# gpu_reproduce.sh finds .device-data/$STAGE (or DATA=DIR) and reads the dataset from there through
# POPE_DATA_DIR, re-hashing every file against its manifest first (`pope data info NAME --verify`); it never
# prepares, so the GPU machine needs neither the sources nor music21/miditok/tiktoken. A second call here
# verifies and reuses what is built. Each folder must stay within the carry limit (64 MiB in all per call):
# the script prints every folder's size and fails when one is larger. The folder must be ignored by git
# (carry takes ignored paths only; the repository's .gitignore lists /.device-data/).
#
# Settings (environment): DEVICE_DATA (the folder, default .device-data), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${DEVICE_DATA:-.device-data}
PYTHON=${PYTHON:-python3}
LIMIT_BYTES=$((64 * 1024 * 1024))
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
stages=("$@"); [ "${#stages[@]}" -gt 0 ] || stages=(jsb maestro genome text)
for stage in "${stages[@]}"; do
  case "$stage" in
    jsb|maestro|genome|text) ;;
    *) echo "device_data.sh: unknown stage '$stage' (give jsb, maestro, genome or text)" >&2; exit 2 ;;
  esac
done
mkdir -p "$ROOT"
ignored=0; git check-ignore -q "$ROOT/" 2>/dev/null || ignored=$?  # 1: inside the repository, not ignored
if [ "$ignored" -eq 1 ]; then
  echo "device_data.sh: $ROOT/ is not ignored by git, so the run tool would not carry it; ignore it first:" >&2
  echo "  echo /${ROOT#./}/ >> \"\$(git rev-parse --git-common-dir)/info/exclude\"" >&2
  exit 2
fi
status=0
for stage in "${stages[@]}"; do
  target="$ROOT/$stage/$stage"  # the dataset of a stage has the stage's name
  mkdir -p "$ROOT/$stage"
  "$PYTHON" -m pope.cli data prepare "$stage" --out "$target" --no-progress | tail -n 1
  # nothing but the dataset may sit in the stage folder (the carry limit counts all of it)
  extra=$(find "$ROOT/$stage" -mindepth 1 -maxdepth 1 ! -name "$stage")
  [ -z "$extra" ] || { echo "device_data.sh: $ROOT/$stage holds more than the dataset: $extra" >&2; status=1; }
  bytes=$(du -sb "$ROOT/$stage" | cut -f1)
  awk -v s="$stage" -v b="$bytes" -v d="$ROOT/$stage" 'BEGIN { printf "%-8s %6.1f MiB (%d bytes)  %s\n", s, b / 1048576, b, d }'
  if [ "$bytes" -gt "$LIMIT_BYTES" ]; then
    echo "device_data.sh: $ROOT/$stage is $bytes bytes, over the 64 MiB a carry takes" >&2
    status=1
  fi
done
exit $status
