//! The programs the benchmarks run, embedded from the repository's `bench/` folder so
//! that the `advm` binary carries them. This file is the one place that knows where
//! that folder is: `bench/` at the workspace root, two levels above this crate.

/// The text of `bench/<path>` (the path given in pieces, joined).
macro_rules! bench_file {
    ($($path:literal),+) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/", $($path),+))
    };
}
pub(crate) use bench_file;

/// One workload: file name, contents, and whether it is R or Python.
pub struct Workload {
    /// File name, as written into the scratch directory.
    pub file: &'static str,
    /// Contents.
    pub text: &'static str,
    /// Run by python3 (else by Rscript).
    pub python: bool,
}

/// The R workload `bench/run/<name>`.
macro_rules! r_script {
    ($name:literal) => {
        $crate::workloads::Workload { file: $name, text: $crate::workloads::bench_file!("run/", $name), python: false }
    };
}
pub(crate) use r_script;

/// Sourced by every R workload.
pub const COMMON_R: &str = bench_file!("run/common.R");

/// The R script that forks (parallel::mclapply), written beside the workloads; the
/// output tests run it from bench/run.
pub const FORK_SCRIPT: &str = bench_file!("run/fork_mclapply.R");

/// The copy-threshold probe (C): ns per allocate, fill, copy, write, free cycle by size.
pub const THRESHOLD_PROBE: &str = bench_file!("run/threshold.c");

/// The R workloads of the full run: a subset of R-benchmark-25 and eight ML scripts.
pub fn r_workloads() -> Vec<Workload> {
    vec![
        r_script!("b25_matrix.R"),
        r_script!("b25_sort.R"),
        r_script!("b25_vector.R"),
        r_script!("ml_randomforest.R"),
        r_script!("ml_lssvm.R"),
        r_script!("ml_svm.R"),
        r_script!("ml_rpart.R"),
        r_script!("ml_nnet.R"),
        r_script!("ml_gbm.R"),
        r_script!("ml_knn.R"),
        r_script!("ml_glmnet.R"),
    ]
}

/// The NumPy/pandas workload.
pub fn python_workload() -> Workload {
    Workload { file: "numpy_copy.py", text: bench_file!("run/numpy_copy.py"), python: true }
}
