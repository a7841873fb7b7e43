#!/usr/bin/env bash
# edgetrain-dse end to end on a tiny two-conv model and a small budget (seconds): exit 0,
# a dropout table with the documented fields whose points are a Pareto front; a bad grid
# exits 1 and leaves no table. usage: dse_run.sh EDGETRAIN_DSE
set -euo pipefail
dse="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
spec='input 28x28x1; conv 4 3x3 relu; maxpool 2; conv 4 3x3 relu; maxpool 2; fc 10'
"$dse" --model "$spec" --levels 0,0.5 --updates 100 --eval-examples 300 --time-steps 3 \
  --out "$work/table.json" 2>"$work/progress.txt"
grep -q '\[4/4\] rates' "$work/progress.txt" || { echo "no progress on stderr"; cat "$work/progress.txt"; exit 1; }
python3 - "$work/table.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
assert t["format"] == "edgetrain-dropout-table" and t["format_version"] == 1, t
assert t["model"]["layout_id"].startswith("0x") and t["dropout_rescale"] == "inverted"
pts = t["points"]
assert 1 <= len(pts) <= 4
for p in pts:
    assert len(p["drop_rates"]) == 2 and all(r in (0, 0.5) for r in p["drop_rates"]), p
    assert 0 < p["relative_flops"] <= 1 and p["relative_time"] > 0 and 0 <= p["accuracy"] <= 1, p
for a, b in zip(pts, pts[1:]):  # by time ascending, each slower point more accurate
    assert a["relative_time"] <= b["relative_time"] and a["accuracy"] < b["accuracy"], pts
PY
if "$dse" --model "$spec" --levels 0,1 --out "$work/bad.json" 2>/dev/null; then echo "a rate of 1 was accepted"; exit 1; fi
[[ ! -e "$work/bad.json" ]] || { echo "a refused grid wrote a table"; exit 1; }
echo "dse_run: ok"
