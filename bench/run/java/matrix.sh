#!/bin/sh
# Every AdvmJava workload under every `advm run` mode and collector, against a plain run:
# prints one line per run (exit status, same output or not, hs_err files, seconds) and
# keeps each run's stdout/stderr in $OUT. Usage: matrix.sh ADVM OUT [MODES] [GCS]
set -u
ADVM=$1; OUT=$2
MODES=${3:-"off alloc vcopy ksm ksm-aggr merge"}
GCS=${4:-"Serial Parallel G1 Shenandoah Z"}
SRC=$(dirname "$0")/../../../crates/advm-cli/tests/java/AdvmJava.java
mkdir -p "$OUT/cls" && javac -d "$OUT/cls" "$SRC" || exit 1
[ -f "$OUT/big.bin" ] || head -c 100000000 /dev/urandom > "$OUT/big.bin"
export ADVM_SOCKET="$OUT/none.sock"   # merge mode: the process's own store
cd "$OUT"
for gc in $GCS; do
  for w in "copy 64" "threads 8 8" "fork 10" "heap 256" "direct 64" "file $OUT/big.bin" "hold 64 3"; do
    name=$(echo "$gc-$w" | tr ' /' '__' | cut -c1-40)
    java -XX:+Use${gc}GC -Xmx2g -cp cls AdvmJava $w > "$name.plain" 2>/dev/null
    for m in $MODES; do
      rm -f hs_err_pid*.log
      t0=$(date +%s.%N)
      timeout 180 "$ADVM" run --mode "$m" --stats -- java -XX:+Use${gc}GC -Xmx2g -cp cls AdvmJava $w > "$name.$m.out" 2> "$name.$m.err"
      rc=$?
      t1=$(date +%s.%N)
      same=same; cmp -s "$name.plain" "$name.$m.out" || same=DIFF
      hs=$(ls hs_err_pid*.log 2>/dev/null | wc -l)
      [ "$hs" -gt 0 ] && mv hs_err_pid*.log "$name.$m.hs_err"
      printf '%-12s %-28s %-9s rc=%-3s %s hs_err=%s %.1fs\n' "$gc" "$w" "$m" "$rc" "$same" "$hs" "$(echo "$t1 - $t0" | bc)"
    done
  done
done
