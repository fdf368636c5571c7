//! The in-`cargo test` fuzz harness: a checked-in corpus and seeded
//! mutations of it, run through a check; shared by the test files that
//! run the checks of `lib.rs` and `cluster.rs` (they include it by path).

use std::path::{Path, PathBuf};

/// Mutations tried per corpus input.
const MUTATIONS_PER_INPUT: usize = 64;
/// Mutated inputs at least, however small the corpus.
const MIN_MUTATIONS: usize = 4_000;
/// Mutated inputs at most, however large the corpus (keeps it to seconds).
const MAX_MUTATIONS: usize = 60_000;

/// The inputs of `fuzz/corpus/<target>/`, in file-name order.
pub fn corpus(fuzz_dir: &Path, target: &str) -> Vec<Vec<u8>> {
    let dir = fuzz_dir.join("corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> =
        files.iter().map(|p| std::fs::read(p).expect("corpus file")).collect();
    assert!(!inputs.is_empty(), "{} has no inputs", dir.display());
    inputs
}

/// xorshift64*: deterministic, so a failure reproduces.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

/// Values that sit on the edges of length and count fields.
const EDGES: [u32; 8] = [0, 1, 0x7f, 0x80, 0xff, 0x7fff_ffff, 0x8000_0000, 0xffff_ffff];

/// One to four random edits of `input` (bit flips, edge values written
/// over length fields, inserts, deletes, duplicated runs, truncation, a
/// splice with another input).
fn mutate(rng: &mut Rng, input: &[u8], all: &[Vec<u8>]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(b.len() + 1);
        match rng.below(8) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = EDGES[rng.below(EDGES.len())] as u8;
            }
            2 if b.len() >= 4 => {
                let i = rng.below(b.len() - 3);
                b[i..i + 4].copy_from_slice(&EDGES[rng.below(EDGES.len())].to_be_bytes());
            }
            3 => b.insert(at, rng.next() as u8),
            4 if !b.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(b.len());
                b.drain(at.min(end)..end);
            }
            5 if !b.is_empty() => {
                let start = rng.below(b.len());
                let end = (start + 1 + rng.below(32)).min(b.len());
                let run = b[start..end].to_vec();
                b.splice(at..at, run);
            }
            6 => b.truncate(at),
            _ => {
                let other = &all[rng.below(all.len())];
                let from = rng.below(other.len() + 1);
                b.truncate(at);
                b.extend_from_slice(&other[from..]);
            }
        }
    }
    b
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs `check` over `target`'s corpus and seeded mutations of it; a
/// failing input is printed as hex.
pub fn survives_corpus_and_mutations(fuzz_dir: &Path, target: &str, check: fn(&[u8])) {
    let inputs = corpus(fuzz_dir, target);
    let run = |input: &[u8]| {
        if std::panic::catch_unwind(|| check(input)).is_err() {
            panic!("{target} failed on input {}", hex(input));
        }
    };
    for input in &inputs {
        run(input);
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ target.len() as u64);
    let n = (inputs.len() * MUTATIONS_PER_INPUT).clamp(MIN_MUTATIONS, MAX_MUTATIONS);
    for i in 0..n {
        let mutated = mutate(&mut rng, &inputs[i % inputs.len()], &inputs);
        run(&mutated);
    }
}
