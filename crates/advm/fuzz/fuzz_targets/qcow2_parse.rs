//! Feeds arbitrary bytes to the qcow2 parser as a whole image file: header,
//! extensions, L1 and L2 tables, compressed payloads. It must return Ok or Err,
//! never panic, hang or allocate without bound.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = advm::image::parse_layer_bytes(data, 4096);
});
