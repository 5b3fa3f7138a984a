//! Splitting per-page work (hashing, copying, comparing) over a few threads.

/// Runs `work` on each of `parts` and returns the results in order: the first part on
/// this thread, each other on a scoped thread named `name` (small stack: the work
/// keeps its data on the heap). A part whose thread cannot be started runs here after
/// the first, so a process at its thread limit still gets every result; a part that
/// panics panics here.
pub(crate) fn in_threads<P: Sync, T: Send>(name: &str, parts: &[P], work: impl Fn(&P) -> T + Sync) -> Vec<T> {
    let Some((head, rest)) = parts.split_first() else { return Vec::new() };
    let work = &work;
    std::thread::scope(|scope| {
        let spawned: Vec<_> = rest
            .iter()
            .map(|p| {
                let t = std::thread::Builder::new()
                    .name(name.into())
                    .stack_size(64 << 10)
                    .spawn_scoped(scope, move || work(p));
                (p, t)
            })
            .collect();
        let mut out = Vec::with_capacity(parts.len());
        out.push(work(head));
        for (p, t) in spawned {
            out.push(match t {
                Ok(t) => t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => work(p),
            });
        }
        out
    })
}

/// The first index of each part when `n` items are split among up to four threads (as
/// many as there are CPUs), each taking at least `min_per_thread`, and the part's size.
pub(crate) fn split(n: usize, min_per_thread: usize) -> Vec<(usize, usize)> {
    let threads = std::thread::available_parallelism().map_or(1, |c| c.get()).min(4);
    let per = n.div_ceil(threads).max(min_per_thread).max(1);
    (0..n).step_by(per).map(|first| (first, per.min(n - first))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_and_from_other_threads() {
        let parts: Vec<usize> = (0..8).collect();
        let here = std::thread::current().id();
        let out = in_threads("advm-test", &parts, |&p| (p * 10, std::thread::current().id() != here));
        assert_eq!(out.iter().map(|r| r.0).collect::<Vec<_>>(), (0..8).map(|p| p * 10).collect::<Vec<_>>());
        assert!(!out[0].1, "the first part runs on the caller's thread");
        assert!(out[1..].iter().all(|r| r.1), "the other parts run on their own threads");
        assert!(in_threads("advm-test", &[] as &[usize], |&p| p).is_empty());
    }

    #[test]
    fn split_covers_every_item_once() {
        for n in [0, 1, 4095, 4096, 4097, 100_000] {
            let parts = split(n, 4096);
            assert_eq!(parts.iter().map(|p| p.1).sum::<usize>(), n);
            assert!(parts.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
            assert!(parts.len() <= 4);
            assert!(parts.iter().all(|p| p.1 > 0));
        }
    }

    #[test]
    #[should_panic(expected = "part 3")]
    fn a_panicking_part_panics_the_caller() {
        let parts: Vec<usize> = (0..4).collect();
        in_threads("advm-test", &parts, |&p| assert_ne!(p, 3, "part 3"));
    }
}
