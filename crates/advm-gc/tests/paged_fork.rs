//! A heap in pager regions, used in a child forked from its process: the pager's
//! regions (the heap's memory) are not inherited, so allocation and collection there
//! fail with the pager's error, object access panics saying why, and dropping the
//! heap's mutator and the heap returns; before, the child's first allocation was a
//! segmentation fault. The parent's heap keeps its objects. (Alone in its test binary,
//! so the fork happens with no other test thread running.)

use std::sync::Arc;

use advm::pager::{Config as PagerConfig, Pager};
use advm_gc::{Config, Error, Heap, Paging};

/// What the child checks, in order; its exit status is the first one that failed.
fn in_child(heap: Heap, mut m: advm_gc::Mutator, list: usize) -> i32 {
    let unrecoverable = |e: &Error| matches!(e, Error::Memory(advm::Error::Unrecoverable { .. }));
    match m.alloc(1, 8) {
        Err(e) if unrecoverable(&e) && e.to_string().contains("make a new pager in the child") => {}
        _ => return 2,
    }
    match heap.collect() {
        Err(e) if unrecoverable(&e) => {}
        _ => return 3,
    }
    match m.collect_minor() {
        Err(e) if unrecoverable(&e) => {}
        _ => return 4,
    }
    let head = m.root(list).expect("the root stack is the child's copy");
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.word(head, 0)));
    let msg = read.err().and_then(|p| p.downcast::<String>().ok()).map(|s| *s).unwrap_or_default();
    if !msg.contains("cannot be used here") {
        return 5;
    }
    drop(m);
    drop(heap);
    0
}

#[test]
fn a_paged_heap_in_a_forked_child_fails_clearly_instead_of_faulting() {
    if let Err(why) = advm::pager::available() {
        eprintln!("skipped: {why}");
        return;
    }
    let pager = Arc::new(Pager::new(PagerConfig::new(4 << 20)).unwrap());
    let mut c = Config::new(8 << 20);
    c.gc_threads = 1;
    c.paging = Some(Paging::new(pager));
    let heap = Heap::with_config(c).unwrap();
    let mut m = heap.attach();
    let list = m.push_root(None);
    for i in 0..1000 {
        let o = m.alloc(1, 8).unwrap();
        m.set_word(o, 0, i);
        m.set(o, 0, m.root(list));
        m.set_root(list, Some(o));
    }
    // SAFETY: the child runs the checks in `in_child` and leaves with _exit.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // A child's panic message on stderr is expected (the read that panics).
        std::panic::set_hook(Box::new(|_| {}));
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || in_child(heap, m, list))).unwrap_or(6);
        // SAFETY: leave the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x} (exit {}, signal {})",
        libc::WEXITSTATUS(status),
        libc::WTERMSIG(status)
    );
    m.collect().unwrap();
    let (mut o, mut n) = (m.root(list), 1000);
    while let Some(x) = o {
        n -= 1;
        assert_eq!(m.word(x, 0), n);
        o = m.get(x, 0);
    }
    assert_eq!(n, 0);
}
