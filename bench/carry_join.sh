#!/usr/bin/env bash
# Device side of bench/carry_split.sh: join the two parts, check, unpack and install the wheels.
#
#   bench/carry_join.sh [PART_B_DIR] [NAME]
#
# Part A must already be in /tmp/w (copied there by the first call: `mkdir -p /tmp/w && cp
# PART_A_DIR/* /tmp/w/`; /tmp survives between calls while the machine stays warm); part B is
# read from PART_B_DIR (the second call's carried folder; default /tmp/w). The joined tar is
# checked against NAME.sha256, unpacked into /tmp/w/NAME/ and its wheels installed with
# `pip install --no-index --no-deps --target $CARRY_SITE` (default /tmp/site). A wheel whose
# distribution the image already has, at the same or a newer version, is skipped (CARRY_ALL=1
# installs every wheel), so the image's own packages (protobuf, requests, ...) are not shadowed;
# an older one is shadowed by the carried version. CARRY_W moves /tmp/w (tests). Then run with
#   PYTHONPATH=/tmp/site:$PYTHONPATH
set -euo pipefail
B=${1:-/tmp/w}; NAME=${2:-ray}; W=${CARRY_W:-/tmp/w}; SITE=${CARRY_SITE:-/tmp/site}; PY=${PYTHON:-python3}
for f in "$W/$NAME.part00" "$B/$NAME.part01"; do
  [ -f "$f" ] || { echo "carry_join: missing $f" >&2; exit 2; }
done
cat "$W/$NAME.part00" "$B/$NAME.part01" > "$W/$NAME.tar"
want=$(cat "$B/$NAME.sha256" 2>/dev/null || cat "$W/$NAME.sha256" 2>/dev/null || echo "")
got=$(sha256sum "$W/$NAME.tar" | cut -d' ' -f1)
if [ -n "$want" ] && [ "$want" != "$got" ]; then
  echo "carry_join: $NAME.tar is corrupt (sha256 $got, expected $want)" >&2; exit 1
fi
rm -rf "${W:?}/$NAME"; mkdir -p "$W/$NAME" "$SITE"
tar -xf "$W/$NAME.tar" -C "$W/$NAME"
# keep: wheels whose distribution the image lacks or has in an older version (CARRY_ALL=1: all)
mapfile -t todo < <("$PY" - "$W/$NAME" "${CARRY_ALL:-0}" <<'PYEOF'
import glob, importlib.metadata as md, os, re, sys
def key(v):
    return [int(x) for x in re.findall(r"\d+", v.split("+")[0])[:4]]
folder, all_ = sys.argv[1], sys.argv[2] == "1"
for whl in sorted(glob.glob(os.path.join(folder, "*.whl"))):
    dist, version = os.path.basename(whl).split("-")[:2]
    try:
        have = md.version(dist)
    except md.PackageNotFoundError:
        have = None
    if not all_ and have is not None and key(have) >= key(version):
        print(f"carry_join: {dist} {have} already installed (carried {version}); skipped", file=sys.stderr)
        continue
    print(whl)
PYEOF
)
if [ ${#todo[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "${todo[@]}"
fi
echo "carry_join: installed ${#todo[@]} wheel(s) into $SITE; use PYTHONPATH=$SITE:\$PYTHONPATH"
