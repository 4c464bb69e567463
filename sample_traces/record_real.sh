#!/usr/bin/env bash
# Record the real-model suite's traces on a CUDA machine: `gpuadvisor profile` of each examples/real/*.py at
# full size, 3 profiled steps with shapes, FLOPs and Python stacks. Writes OUT/<name>.json.gz (the trace)
# and OUT/<name>.report.json (the profile report of the same run), then OUT/recording.json.
#   bash sample_traces/record_real.sh OUT [name ...]
set -euo pipefail
out=${1:?usage: record_real.sh OUT [name ...]}
shift
mkdir -p "$out"
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in examples/real/[a-z]*.py; do names+=("$(basename "$f" .py)"); done
fi
for name in "${names[@]}"; do
  run=$(mktemp -d)
  rm -rf "$run"
  if python3 -m gpuadvisor profile "examples/real/$name.py" --warmup 5 --steps 20 --min-time 2 --out "$run" --format json > /dev/null 2> "$out/$name.stderr"; then
    cp "$run/trace.json.gz" "$out/$name.json.gz"
    cp "$run/report.json" "$out/$name.report.json"
    rm -f "$out/$name.stderr"
    echo "$name: $(du -k "$out/$name.json.gz" | cut -f1) kB"
  else
    echo "$name: profile failed (exit $?): $(tail -n 1 "$out/$name.stderr")"
  fi
  rm -rf "$run"
done
python3 - "$out" <<'PY'
import datetime, json, sys, torch
print(json.dumps({"command": "bash sample_traces/record_real.sh OUT", "gpu": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}),
      file=open(sys.argv[1] + "/recording.json", "w"))
PY
