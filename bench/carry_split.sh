#!/usr/bin/env bash
# Split a folder of wheels over two device calls (a call carries at most 64 MiB).
#
#   bench/carry_split.sh SRC_DIR PART_A_DIR PART_B_DIR MAX_A_MB [NAME]
#
# All *.whl of SRC_DIR go into one tar (NAME.tar, NAME defaults to "ray"), which is cut into
# PART_A_DIR/NAME.part00 (at most MAX_A_MB MiB) and PART_B_DIR/NAME.part01 (the rest, which
# must fit in 64 MiB too). Writes NAME.sha256 (of the whole tar) beside each part, so the device
# side (bench/carry_join.sh) can check the joined tar. Folders are created; old parts replaced.
# Example (ray 2.60 + dependencies, ~80 MB):
#   bench/carry_split.sh .carry_ray .carry_rayA .carry_rayB 50
set -euo pipefail
SRC=${1:?SRC_DIR}; A=${2:?PART_A_DIR}; B=${3:?PART_B_DIR}; MAX_A=${4:?MAX_A_MB}; NAME=${5:-ray}
LIMIT_MB=64
shopt -s nullglob
wheels=("$SRC"/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then echo "carry_split: no *.whl in $SRC" >&2; exit 2; fi
if ! [[ "$MAX_A" =~ ^[0-9]+$ ]] || [ "$MAX_A" -lt 1 ] || [ "$MAX_A" -gt "$LIMIT_MB" ]; then
  echo "carry_split: MAX_A_MB must be an integer in 1..$LIMIT_MB, got $MAX_A" >&2; exit 2
fi
mkdir -p "$A" "$B"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tar -cf "$tmp/$NAME.tar" -C "$SRC" $(cd "$SRC" && ls *.whl)
size=$(stat -c %s "$tmp/$NAME.tar")
max_a=$((MAX_A * 1024 * 1024))
rest=$((size > max_a ? size - max_a : 0))
if [ "$rest" -gt $((LIMIT_MB * 1024 * 1024)) ]; then
  echo "carry_split: $size bytes do not fit in two parts of <= $MAX_A and $LIMIT_MB MiB" >&2; exit 1
fi
rm -f "$A/$NAME".part* "$B/$NAME".part*
head -c "$max_a" "$tmp/$NAME.tar" > "$A/$NAME.part00"
tail -c +"$((max_a + 1))" "$tmp/$NAME.tar" > "$B/$NAME.part01"   # empty when the tar fits in part A
sum=$(sha256sum "$tmp/$NAME.tar" | cut -d' ' -f1)
echo "$sum" > "$A/$NAME.sha256"; echo "$sum" > "$B/$NAME.sha256"
echo "carry_split: ${#wheels[@]} wheels, $size bytes -> $A/$NAME.part00 ($(stat -c %s "$A/$NAME.part00") bytes)" \
     "+ $B/$NAME.part01 ($(stat -c %s "$B/$NAME.part01") bytes); sha256 $sum"
