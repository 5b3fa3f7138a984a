#!/bin/bash
# copyrun.sh MODE [JAVA ARGS...]: one `advm run --mode MODE --cgroup --json -- java ARGS`,
# with `advm stat --watch` on the JVM every 100 ms beside it. Prints: mode wall_s cpu_s
# distinct_mean_mib cgroup_mean_mib cgroup_peak_mib (distinct: anon+shmem, held
# included; cgroup: the run's own group, every 50 ms). ADVM: the advm binary.
set -euo pipefail
mode=$1; shift
advm=${ADVM:-advm}
tmp=$(mktemp -d /tmp/jvmrun-copy.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s.%N)
bash -c '"$@" >/dev/null 2>"$0"; times >"$0.times"' "$tmp/cg" "$advm" run --mode "$mode" --cgroup --json -- java "$@" &
sh=$!
until a=$(pgrep -P $sh -x advm); do sleep 0.01; done
until j=$(cat /proc/$a/task/$a/children 2>/dev/null) && [ -n "$j" ]; do sleep 0.01; done
"$advm" stat --watch 0 --interval 100 --json $j >"$tmp/stat" 2>/dev/null || true
wait $sh
t1=$(date +%s.%N)
python3 - "$mode" "$t0" "$t1" "$tmp" <<'PY'
import json, sys
mode, t0, t1, tmp = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
cg = json.load(open(tmp + "/cg"))
st = json.load(open(tmp + "/stat"))
times = open(tmp + "/cg.times").read().split()  # shell's, then children's user/sys
cpu = sum(float(x.split("m")[0]) * 60 + float(x.split("m")[1].rstrip("s")) for x in times[2:4])
mib = 1 << 20
print(f"{mode} {t1 - t0:.2f} {cpu:.2f} {st['anon_shmem_bytes']['mean'] / mib:.0f} "
      f"{cg['anon_shmem_bytes']['mean'] / mib:.0f} {cg['anon_shmem_bytes']['max'] / mib:.0f}")
PY
