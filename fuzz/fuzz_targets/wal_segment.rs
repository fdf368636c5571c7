#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| narad_fuzz::wal_segment(data));
