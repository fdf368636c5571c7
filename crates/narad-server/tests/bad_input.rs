//! Bad input, in seconds: the checks of the fuzz targets (`fuzz/src/lib.rs`,
//! one per decoder) run over the checked-in corpora `fuzz/corpus/<target>/`
//! and over seeded mutations of them. The property of every decoder: no
//! panic on any input, every failure a clean `Err` (a 400 or 413 at the
//! HTTP edge), and what decodes re-encodes where the format is canonical.
//!
//! A failing input is printed as hex; put it in `fuzz/corpus/<target>/`
//! once fixed, so it stays a regression test. The long runs are
//! `cargo +nightly fuzz run <target>` (docs/DURABILITY.md, Fuzzing).

#[path = "../../../fuzz/src/lib.rs"]
mod checks;

#[path = "../../../fuzz/src/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn corpus_dir(target: &str) -> PathBuf {
    fuzz_dir().join("corpus").join(target)
}

/// Runs `target`'s check over its corpus and mutations of it.
fn survives_corpus_and_mutations(target: &str) {
    let check = checks::CHECKS
        .iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("no check named {target}"))
        .1;
    harness::survives_corpus_and_mutations(&fuzz_dir(), target, check);
}

#[test]
fn wal_record_decoding_never_panics_and_round_trips() {
    survives_corpus_and_mutations("wal_record");
}

#[test]
fn wal_segment_recovery_never_panics_on_damaged_images() {
    survives_corpus_and_mutations("wal_segment");
}

#[test]
fn log_frame_decoding_never_panics_and_agrees_with_its_bounds() {
    survives_corpus_and_mutations("log_frame");
}

#[test]
fn log_envelope_decoding_never_panics_and_round_trips() {
    survives_corpus_and_mutations("log_envelope");
}

#[test]
fn log_segment_scan_never_panics_on_damaged_images() {
    survives_corpus_and_mutations("log_segment");
}

#[test]
fn batch_body_decoding_answers_400_or_413_never_panics() {
    survives_corpus_and_mutations("batch_body");
}

#[test]
fn receipt_handle_parsing_never_panics_and_round_trips() {
    survives_corpus_and_mutations("receipt_handle");
}

#[test]
fn query_parameter_parsing_answers_400_never_panics() {
    survives_corpus_and_mutations("query_params");
}

#[test]
fn go_duration_parsing_never_panics_and_round_trips() {
    survives_corpus_and_mutations("go_duration");
}

#[test]
fn every_fuzz_target_has_a_corpus_and_a_test_here() {
    let this = include_str!("bad_input.rs");
    for (name, _) in checks::CHECKS {
        assert!(corpus_dir(name).is_dir(), "fuzz/corpus/{name} is missing");
        assert!(
            this.contains(&format!("survives_corpus_and_mutations(\"{name}\")")),
            "no test runs the {name} check"
        );
        let target = corpus_dir(name).join(format!("../../fuzz_targets/{name}.rs"));
        assert!(target.is_file(), "fuzz/fuzz_targets/{name}.rs is missing");
    }
}

/// Writes the seed inputs of every corpus (run once by hand; the fuzzer
/// grows the corpora from them and `cargo fuzz cmin` trims them):
/// `cargo test -p narad-server --test bad_input -- --ignored write_seed_corpora`.
#[test]
#[ignore = "writes fuzz/corpus seeds into the source tree"]
fn write_seed_corpora() {
    for (target, seeds) in seeds::all() {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds {
            std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
        }
    }
}

mod seeds {
    use std::io::Write;

    use narad_log::Codec;
    use narad_log::frame::{FrameSeed, PayloadBuilder};
    use narad_wal::RecordRef;

    type Seeds = Vec<(String, Vec<u8>)>;

    pub fn all() -> Vec<(&'static str, Seeds)> {
        vec![
            ("wal_record", wal_records()),
            ("wal_segment", wal_segments()),
            ("log_frame", log_frames()),
            ("log_envelope", log_envelopes()),
            ("log_segment", log_segments()),
            ("batch_body", batch_bodies()),
            ("receipt_handle", text(&["0:0:1", "2:17:3", "4294967295:18446744073709551615:9"])),
            (
                "query_params",
                text(&[
                    "key=a+b%21&partition=2",
                    "partition=1&offset=5&wait=1.5s&max=10",
                    "receipt_handle=0%3A1%3A2&extend=true",
                    "limit=10&page_token=orders.eu",
                    "wait=250ms&partition=0&extend=0",
                ]),
            ),
            ("go_duration", text(&["10s", "1m30s", "1.5h", "-3ms", "0", "250us", "1µs2ns"])),
        ]
    }

    fn text(items: &[&str]) -> Seeds {
        items
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("text-{i}"), s.as_bytes().to_vec()))
            .collect()
    }

    fn named(seeds: Vec<(&str, Vec<u8>)>) -> Seeds {
        seeds.into_iter().map(|(n, b)| (n.to_owned(), b)).collect()
    }

    fn records() -> Vec<RecordRef<'static>> {
        let r = RecordRef {
            topic: "orders",
            incarnation: None,
            key: Some(b"customer-42"),
            partition: 1,
            accepted_at_ms: 1_700_000_000_000,
            payload: b"{\"id\":1}",
        };
        vec![
            r,
            RecordRef { key: None, ..r },
            RecordRef { key: Some(b""), payload: b"\x00\xff", ..r },
            RecordRef { incarnation: Some(7), ..r },
        ]
    }

    fn encode(r: &RecordRef<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        r.encode_into(&mut out);
        out
    }

    fn wal_records() -> Seeds {
        let names = ["format1-key", "format1-no-key", "format1-empty-key", "format2"];
        names.into_iter().map(String::from).zip(records().iter().map(encode)).collect()
    }

    /// A segment image holding every record: version 2 (salted) when
    /// `salt` is given, else version 1 as an older binary wrote it.
    fn wal_image(salt: Option<u64>) -> Vec<u8> {
        use narad_wal::frame::{FrameSeed, segment_header, segment_header_unsalted};
        let (mut image, seed) = match salt {
            Some(salt) => (segment_header(0, salt).to_vec(), FrameSeed::of_salt(salt)),
            None => (segment_header_unsalted(0, 0).to_vec(), FrameSeed::UNSALTED),
        };
        for (seq, r) in records().iter().enumerate() {
            let payload = encode(r);
            let at = narad_wal::frame::begin_frame(&mut image, payload.len() as u32, seq as u64, 0);
            image.extend_from_slice(&payload);
            narad_wal::frame::seal_frame(&mut image, at, seed);
        }
        image
    }

    fn wal_segments() -> Seeds {
        let mut seeds = Vec::new();
        for (version, salt) in [("", None), ("salted-", Some(0x5a17_5a17_5a17_5a17))] {
            let image = wal_image(salt);
            let torn = image[..image.len() - 5].to_vec();
            seeds.push((format!("{version}sealed"), [&[0u8][..], &image].concat()));
            seeds.push((format!("{version}last"), [&[1u8][..], &image].concat()));
            seeds.push((format!("{version}last-torn"), [&[1u8][..], &torn].concat()));
        }
        seeds
    }

    fn payload() -> PayloadBuilder {
        let mut p = PayloadBuilder::new();
        p.push(None, 1_700_000_000_000, b"hello");
        p.push(Some(b"k"), 1_700_000_000_001, b"world!");
        p.push(Some(b""), 1_700_000_000_002, b"{\"a\":1}");
        p
    }

    fn frame(base: u64, codec: Codec) -> Vec<u8> {
        payload().finish(base, codec, FrameSeed::UNSALTED).unwrap()
    }

    fn salted_frame(base: u64, codec: Codec) -> Vec<u8> {
        payload().finish(base, codec, FrameSeed::of_salt(crate::checks::FUZZ_SALT)).unwrap()
    }

    fn log_frames() -> Seeds {
        let mut raw = PayloadBuilder::new();
        raw.push(Some(b"key"), 5, b"payload");
        let mut built = vec![0x80u8, 1];
        built.extend_from_slice(&{
            let f = raw.finish(0, Codec::None, FrameSeed::UNSALTED).unwrap();
            f[narad_log::limits::FRAME_HEADER_LEN..].to_vec()
        });
        named(vec![
            ("none", [&[0u8][..], &frame(42, Codec::None)].concat()),
            ("zstd", [&[0u8][..], &frame(42, Codec::Zstd { level: 1 })].concat()),
            ("fixup", [&[3u8][..], &frame(42, Codec::None)].concat()),
            ("salted", [&[4u8][..], &salted_frame(42, Codec::None)].concat()),
            ("salted-fixup", [&[7u8][..], &salted_frame(42, Codec::Zstd { level: 1 })].concat()),
            ("built", built),
        ])
    }

    fn log_envelopes() -> Seeds {
        let t = [0, 0, 0x01, 0x91, 0x23, 0x45, 0x67, 0x89];
        let env = |head: &[u8]| [head, &t[..], b"hi"].concat();
        named(vec![
            ("v3-absent", env(&[0x03, 0x00])),
            ("v3-empty", env(&[0x03, 0x01])),
            ("v3-key", env(&[0x03, 0x03, b'k', b'1'])),
            ("v2-key", env(&[0x02, 0x02, b'k', b'1'])),
        ])
    }

    fn log_segments() -> Seeds {
        let mut image = frame(42, Codec::None);
        image.extend_from_slice(&frame(45, Codec::Zstd { level: 1 }));
        let torn = image[..image.len() - 3].to_vec();
        // Format 2: the header comes from the mode byte (bit 1).
        let mut salted = salted_frame(42, Codec::None);
        salted.extend_from_slice(&salted_frame(45, Codec::Zstd { level: 1 }));
        let salted_torn = salted[..salted.len() - 3].to_vec();
        let mut whole = narad_log::segment::segment_header(42, crate::checks::FUZZ_SALT).to_vec();
        whole.extend_from_slice(&salted);
        named(vec![
            ("crc", [&[1u8][..], &image].concat()),
            ("no-crc", [&[0u8][..], &image].concat()),
            ("torn", [&[1u8][..], &torn].concat()),
            ("salted", [&[3u8][..], &salted].concat()),
            ("salted-torn", [&[3u8][..], &salted_torn].concat()),
            ("salted-whole", [&[1u8][..], &whole].concat()),
        ])
    }

    fn batch_bodies() -> Seeds {
        let json: &[u8] = br#"{"messages":[{"key":"k","payload":{"a":1}},{"payload":"text","partition":2},{"key":"AAE=","key_encoding":"base64","payload":"aGk=","payload_encoding":"base64"}]}"#;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(json).unwrap();
        let gz = gz.finish().unwrap();
        let zst = zstd::encode_all(json, 1).unwrap();
        named(vec![
            ("json", [&[0u8][..], json].concat()),
            ("gzip", [&[1u8][..], &gz].concat()),
            ("zstd", [&[2u8][..], &zst].concat()),
            ("json-under-gzip", [&[3u8][..], json].concat()),
            ("json-under-zstd", [&[4u8][..], json].concat()),
            ("empty", [&[0u8][..], br#"{"messages":[]}"#].concat()),
        ])
    }
}
