#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| narad_fuzz::log_frame(data));
