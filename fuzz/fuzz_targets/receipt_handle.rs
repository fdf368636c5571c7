#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| narad_fuzz::receipt_handle(data));
