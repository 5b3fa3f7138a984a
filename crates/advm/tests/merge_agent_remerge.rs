//! A second whole-process merge (`advm::merge::agent::merge_process`) takes the pages
//! the program wrote after the first one: a write to a merged page makes a private
//! anonymous copy inside the store's mapping, and those copies are merged again (an
//! unchanged copy maps the store's page again, a changed one is added), while the
//! store's own pages there are left as they are.

use advm::mem::{page_size, Region};

mod pagemap;

/// Per page from `addr`: whether it is present and anonymous (not a file page).
fn anonymous_pages(addr: usize, n: usize) -> Vec<bool> {
    pagemap::page_kinds(addr, n).into_iter().map(|k| k == "anon").collect()
}

fn fill(page: &mut [u8], i: usize, salt: u8) {
    page.fill((i % 251) as u8 ^ salt | 1);
    page[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
}

#[test]
fn copies_written_into_merged_memory_are_merged_again() {
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    // The process's own store, whatever daemon runs on this machine (set before any
    // thread starts).
    std::env::set_var("ADVM_SOCKET", "/nonexistent/advmd.sock");
    let ps = page_size();
    let n = 1024;
    let mut a = Region::new(n * ps).unwrap();
    for (i, page) in a.bytes_mut().chunks_exact_mut(ps).enumerate() {
        fill(page, i, 0);
    }
    let r1 = advm::merge::agent::merge_process(1 << 20).unwrap();
    eprintln!("first: {r1:?}");
    let anon = anonymous_pages(a.addr().0, n);
    assert!(anon.iter().filter(|&&x| x).count() < n / 16, "the first merge left most pages anonymous: {r1:?}");

    // The program writes pages 100..164 again with the same bytes (copies equal to the
    // store's pages) and pages 300..364 with new bytes.
    let (same, new) = (100..164, 300..364);
    for (i, page) in a.bytes_mut().chunks_exact_mut(ps).enumerate() {
        if same.contains(&i) {
            fill(page, i, 0);
        } else if new.contains(&i) {
            fill(page, i, 0x80);
        }
    }
    let anon = anonymous_pages(a.addr().0, n);
    assert!(same.clone().chain(new.clone()).all(|i| anon[i]), "the writes made private copies");

    let r2 = advm::merge::agent::merge_process(1 << 20).unwrap();
    eprintln!("second: {r2:?}");
    let anon = anonymous_pages(a.addr().0, n);
    let left: Vec<usize> = same.clone().chain(new.clone()).filter(|&i| anon[i]).collect();
    assert!(left.len() <= 4, "copies left anonymous after the second merge: {left:?} ({r2:?})");
    assert!(r2.stats.merged >= same.len() as u64 - 4, "{r2:?}");
    assert!(r2.stats.added >= new.len() as u64 - 4, "{r2:?}");
    // The content is what the program wrote.
    for (i, page) in a.bytes().chunks_exact(ps).enumerate() {
        let mut want = vec![0u8; ps];
        fill(&mut want, i, if new.contains(&i) { 0x80 } else { 0 });
        assert!(page == &want[..], "page {i} changed by the merges");
    }
}
