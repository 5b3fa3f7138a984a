# variants.py: what sweep.py and counters.py share: their command line
# (PASSES WORKLOADS VARIANT...), the interleaved passes and the median.
import os, sys

A = os.environ.get('ADVM', 'advm')
B = os.path.dirname(os.path.abspath(__file__))
ALL = ['b25_matrix', 'b25_sort', 'b25_vector', 'ml_randomforest', 'ml_lssvm', 'ml_svm', 'ml_rpart', 'ml_nnet', 'ml_gbm', 'ml_knn', 'ml_glmnet']


def parse(argv=sys.argv):
    """(passes, workloads, [(name, mode, env)]) from PASSES WORKLOADS VARIANT..."""
    passes = int(argv[1])
    ws = ALL if argv[2] == 'all' else argv[2].split(',')
    vs = []
    for v in argv[3:]:
        p = v.split(':', 2)
        env = dict(kv.split('=', 1) for kv in p[2].split(',')) if len(p) > 2 and p[2] else {}
        vs.append((p[0], p[1], env))
    return passes, ws, vs


def env(extra):
    """The environment of one run: the R scripts here, at full scale, plus `extra`."""
    return dict(os.environ, ADVM_BENCH_DIR=B, ADVM_BENCH_SCALE='1', **extra)


def interleave(passes, ws, vs, run, after=None):
    """res[workload][variant] = [run(w, mode, env) per pass]; every variant of a workload
    runs in each pass, so a slow phase of the machine hits them alike. `after(res)`
    follows each run."""
    res = {}
    for _ in range(passes):
        for w in ws:
            for name, mode, extra in vs:
                res.setdefault(w, {}).setdefault(name, []).append(run(w, mode, extra))
                if after:
                    after(res)
    return res


def med(x):
    s = sorted(x)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
