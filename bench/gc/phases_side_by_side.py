#!/usr/bin/env python3
"""Largest pause and phases of advm-gc's `workload` example, two builds side by side.

Usage: BEFORE=path/to/workload AFTER=path/to/workload phases_side_by_side.py ROUNDS TAG
(each binary: `cargo build --release -p advm-gc --example workload` of one commit,
copied aside). Runs every workload at its 1.2x and 2x heap on 1 and 2 GC threads,
interleaved; run it under the bench lock. Prints the median of the runs' largest pauses
and the phases; writes the raw figures to /tmp/phases-TAG.json.
"""
import json
import os
import re
import statistics
import subprocess
import sys

W=[("gcbench",8.4),("gcbench",14),("binary-trees",7.2),("binary-trees",12),("compiler-sawtooth",6.6),("compiler-sawtooth",11)]
B, A = os.environ["BEFORE"], os.environ["AFTER"]
V=[("before/1",[B],None),("before/2",[B],"2"),("after/1",[A],None),("after/2",[A],"2")]
rounds=int(sys.argv[1]) if len(sys.argv)>1 else 3
res={}
pat=re.compile(r"pause\s+([\d.]+) ms\s+stop ([\d.]+) mark ([\d.]+) fwd ([\d.]+) adj ([\d.]+) move ([\d.]+)")
for r in range(rounds):
  for w,mib in W:
    for name,cmd,t in V:
      args=cmd+[w,str(mib),"full"]+([t] if t else [])
      out=subprocess.run(args,capture_output=True,text=True,check=True).stdout
      cs=[tuple(map(float,m.groups())) for m in pat.finditer(out)]
      mx=max(cs,key=lambda c:c[0])
      means=[statistics.mean(c[i] for c in cs) for i in range(6)]
      res.setdefault((w,mib,name),[]).append((mx,means))
for k,v in res.items():
  mxs=[x[0][0] for x in v]
  i=sorted(range(len(v)),key=lambda j:mxs[j])[len(v)//2]
  mx,means=v[i]
  print(f"{k[0]:18} {k[1]:5} {k[2]:9} max {statistics.median(mxs):6.3f} (runs {' '.join('%.2f'%m for m in mxs)}) | at median-run max: mark {mx[2]:.3f} fwd {mx[3]:.3f} adj {mx[4]:.3f} move {mx[5]:.3f} | mean pause {means[0]:.3f} mark {means[2]:.3f} move {means[5]:.3f}")
json.dump({"|".join(map(str,k)):v for k,v in res.items()},open("/tmp/phases-%s.json" % (sys.argv[2] if len(sys.argv) > 2 else "run"),"w"))
