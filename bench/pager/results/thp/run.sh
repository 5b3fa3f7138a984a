#!/bin/bash
# THP always vs madvise under the pager bench; restores madvise.
set -u
orig=$(grep -o '\[[a-z]*\]' /sys/kernel/mm/transparent_hugepage/enabled | tr -d '[]')
trap 'echo $orig > /sys/kernel/mm/transparent_hugepage/enabled' EXIT
for round in 1 2 3; do
  for mode in madvise always; do
    echo $mode > /sys/kernel/mm/transparent_hugepage/enabled
    grep -E "^thp_(fault_alloc|fault_fallback|split_page|swpout|swpout_fallback|collapse_alloc) " /proc/vmstat > /tmp/thp/vm-$mode-$round.before
    ADVM_BENCH_PAGER_WORKLOADS=compiler-like ADVM_BENCH_PAGER_HEAPS=2 ADVM_BENCH_PAGER_SETTINGS=PFKernel,NoLimit ./target/release/advm bench pager --quick --json > /tmp/thp/$mode-$round.json 2>/tmp/thp/$mode-$round.err
    grep -E "^thp_(fault_alloc|fault_fallback|split_page|swpout|swpout_fallback|collapse_alloc) " /proc/vmstat > /tmp/thp/vm-$mode-$round.after
    echo "$mode $round $(uptime | sed 's/.*average//')"
  done
done
