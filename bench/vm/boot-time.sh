#!/bin/bash
# Boot time, pmem against blk: one VM at a time, the two methods interleaved (odd
# rounds pmem first, even rounds blk first), the host's page cache dropped before each boot. Prints "round method ms load" per boot
# and the medians. Root (drop_caches); run it under the bench lock:
#   flock /work/bench.lock bench/vm/boot-time.sh [ROUNDS]
# Settings: ADVM (the advm binary, default target/release/advm), ADVM_VM_IMAGE.
ADVM=${ADVM:-target/release/advm}
IMAGE=${ADVM_VM_IMAGE:-$HOME/.cache/advm/vm/app.qcow2}
R=${1:-5}
declare -A all
for r in $(seq 1 "$R"); do
  order="pmem blk"; [ $((r % 2)) = 0 ] && order="blk pmem"
  for d in $order; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    out=$("$ADVM" vm run --image "$IMAGE" --disk $d --no-aslr --mem 128 --tb-size 16 --accel tcg \
          --timeout 300 --exit-when-ready 2>/dev/null)
    ms=$(echo "$out" | grep -o "after [0-9]* ms" | grep -o "[0-9]*")
    echo "$r $d ${ms:-failed} $(cut -d' ' -f1 /proc/loadavg)"
    all[$d]="${all[$d]} ${ms}"
  done
done
for d in pmem blk; do
  echo "median $d: $(echo ${all[$d]} | tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}') ms"
done
