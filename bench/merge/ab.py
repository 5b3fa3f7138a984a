# ab.py: adds of new pages through two builds of advm side by side, with the kernel's
# floor between them, so a slow phase of the machine hits every variant alike.
#
#   python3 bench/merge/ab.py ROUNDS NAME=ADVM_BINARY[,VAR=VALUE...]... [--floor FLOOR_BINARY]
#
# (VAR=VALUE: environment of that variant's runs, e.g.
# ADVM_BENCH_MERGE_DAEMON_ARGS=--check-hashes-one-in 1 for the daemon it starts.)
# Each round runs, for each binary in turn, `advm bench merge --runs 3 --json` with
# ADVM_BENCH_MERGE_MODELS=none (the 1 GiB throughput rows and, for builds that have
# them, the charging rows), then `FLOOR 1024` once.
# Prints per round and at the end the medians of the per-run medians, with the load
# average at each run (this machine is shared; see docs/merge.md).
import json, os, statistics, subprocess, sys


def bench(spec):
    binary, *assign = spec.split(',')
    env = dict(os.environ, ADVM_BENCH_MERGE_MODELS='none', **dict(a.split('=', 1) for a in assign))
    out = subprocess.run([binary, 'bench', 'merge', '--runs', '3', '--json'], env=env, check=True,
                         capture_output=True, text=True).stdout
    rep = json.loads(out)
    for note in rep.get('notes', []):
        if 'by phase' in note:
            print('   ', note, flush=True)
    got = {}
    for row in rep['rows']:
        method = dict(row['config']).get('method', '')
        if not method.startswith(('throughput, ', 'charging, ')):
            continue
        for f in row['figures']:
            got[f"{method.removeprefix('throughput, ')}: {f['name']}"] = f['median']
    return got


def floor(binary):
    out = subprocess.run([binary, '1024'], check=True, capture_output=True, text=True).stdout
    got = {}
    for line in out.splitlines():
        if line.endswith('GB/s'):
            got[f'floor: {line[:44].strip()}'] = float(line.split()[-2])
    return got


def main():
    args = sys.argv[1:]
    fl = None
    if '--floor' in args:
        k = args.index('--floor')
        fl = args[k + 1]
        del args[k:k + 2]
    rounds, variants = int(args[0]), [a.split('=', 1) for a in args[1:]]
    res = {}
    for r in range(rounds):
        for name, binary in variants:
            load = os.getloadavg()[0]
            for k, v in bench(binary).items():
                res.setdefault(f'{name} {k}', []).append(v)
            res.setdefault(f'{name} load', []).append(load)
            print(f'round {r + 1} {name}: load {load:.1f}', {k: round(v[-1], 3) for k, v in res.items() if k.startswith(name + ' ') and 'add' in k}, flush=True)
        if fl:
            for k, v in floor(fl).items():
                res.setdefault(k, []).append(v)
    print('\nmedians over rounds (each a median of 3 merges of 1 GiB):')
    for k, v in res.items():
        print(f'  {k:<52} {statistics.median(v):7.3f}   runs: {" ".join(f"{x:.2f}" for x in v)}')


main()
