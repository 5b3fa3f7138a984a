//! docs/merge.md's example: two buffers with the same bytes (as two workers holding one
//! model), merged so they share pages. Through advmd when it runs (`ADVM_SOCKET`, default
//! /run/advm/advmd.sock), else through a store inside this process.
//! `cargo run -p advm --example merge`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let weights: Vec<u8> = (0..16u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let again = weights.clone();
    let first = advm::merge::merge(&weights)?; // the process-wide client: new pages are added
    let second = advm::merge::merge(&again)?; // equal pages now map the stored ones
    println!(
        "first: {} added; second: {} merged, {} skipped, {:.1} ms, via {:?}",
        first.added,
        second.merged,
        second.skipped,
        second.seconds * 1e3,
        second.via
    );
    assert_eq!(weights, again, "merging never changes what the process reads");
    Ok(())
}
