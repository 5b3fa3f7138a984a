//! A merge of many equal pages maps each one over its own page of the store page (one
//! mapping each: the file offsets do not advance), so it must stop at a VMA budget
//! instead of running the process into vm.max_map_count, where the merge failed with
//! ENOMEM half done and every later mmap of the process (malloc, thread stacks) failed
//! too. Its own test binary: it takes half of the process's mappings.

use advm::mem::{page_size, Region};
use advm::merge::Client;

fn vmas() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().count()
}

#[test]
fn a_merge_of_many_equal_pages_stops_at_half_of_max_map_count() {
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    let ps = page_size();
    let max = advm::probe::facts().max_map_count as usize;
    // More than half of vm.max_map_count: without a budget the merge took a mapping
    // per page (and, past vm.max_map_count itself, failed with ENOMEM).
    let pages = max / 2 + 2000;
    let mut r = Region::new(pages * ps).unwrap();
    r.bytes_mut().fill(0x5a);
    let mut c = Client::local(1 << 30, "test").unwrap();
    let s = c.merge(r.bytes()).expect("the merge stops at its VMA budget instead of failing");
    let after = vmas();
    assert!(after <= max / 2 + 16, "{after} mappings after the merge, vm.max_map_count {max}: {s:?}");
    assert!(s.merged + s.added >= (max / 2 - 2000) as u64, "the budget was used: {s:?}");
    assert_eq!(s.merged + s.added + s.skipped, pages as u64, "{s:?}");
    assert!(r.bytes().iter().all(|&b| b == 0x5a), "content unchanged");
    // The process can still map memory, and a second merge keeps within the budget.
    let mut more = Region::new(64 * ps).unwrap();
    more.bytes_mut().fill(0x5b);
    let s2 = c.merge(more.bytes()).unwrap();
    assert!(vmas() <= max / 2 + 32, "{} mappings: {s2:?}", vmas());
    assert!(more.bytes().iter().all(|&b| b == 0x5b));
}
