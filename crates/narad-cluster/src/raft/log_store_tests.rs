//! The log store on SimFs: what it promises survives a crash that keeps
//! only durable bytes; reads refuse damaged records; a failed fsync latches.

use super::*;
use narad_fs::{CrashMode, FaultKind, SimFs};
use openraft::storage::RaftLogStorageExt;
use openraft::testing::{blank_ent, log_id, membership_ent};
use std::io::Cursor;

openraft::declare_raft_types!(
    /// Log-only types for these tests (the state machine is not involved).
    pub T: D = String, R = String, NodeId = u64, Node = openraft::BasicNode,
);

fn data_dir() -> PathBuf {
    PathBuf::from("/data")
}

fn sim() -> SimFs {
    let fs = SimFs::new(7);
    fs.create_dir_all(&data_dir()).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    fs
}

fn open(fs: &SimFs) -> LogStore<T> {
    LogStore::<T>::open(fs, &data_dir()).unwrap()
}

fn ents(range: std::ops::RangeInclusive<u64>) -> Vec<openraft::Entry<T>> {
    range.map(|i| blank_ent::<T>(1, 1, i)).collect()
}

async fn indexes(store: &mut LogStore<T>) -> Vec<u64> {
    store.try_get_log_entries(0..).await.unwrap().iter().map(|e| e.log_id.index).collect()
}

#[test]
fn a_record_is_magic_version_length_crc_and_body() {
    // Golden bytes: "NRAF" | 1 | len 2 | crc32c("{}") (computed by an
    // independent bitwise CRC-32C) | "{}".
    let want = [b"NRAF".as_slice(), &[1], &[0, 0, 0, 2], &[0x29, 0x7b, 0xd0, 0xaa], b"{}"].concat();
    assert_eq!(encode_record(b"{}"), want);
    assert_eq!(decode_record(&want).unwrap(), b"{}");
    // Every damage is refused.
    for (what, at, byte) in [
        ("magic", 0, b'X'),
        ("version", 4, 2),
        ("length", 8, 3),
        ("crc", 12, 1),
        ("body", 13, b'['),
    ] {
        let mut bad = want.clone();
        bad[at] ^= byte;
        assert!(decode_record(&bad).is_err(), "{what}");
    }
    for cut in 0..want.len() {
        assert!(decode_record(&want[..cut]).is_err(), "cut at {cut}");
    }
}

#[tokio::test]
async fn appended_entries_and_the_vote_survive_a_crash_once_acknowledged() {
    let fs = sim();
    let mut store = open(&fs);
    assert_eq!(store.read_vote().await.unwrap(), None);
    store.blocking_append(ents(1..=5)).await.unwrap();
    let vote = openraft::Vote::new_committed(3, 2);
    store.save_vote(&vote).await.unwrap();
    drop(store);
    fs.crash(CrashMode::DropUnsynced);

    let mut store = open(&fs);
    assert_eq!(store.read_vote().await.unwrap(), Some(vote));
    assert_eq!(indexes(&mut store).await, [1, 2, 3, 4, 5]);
    let state = store.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (None, Some(log_id(1, 1, 5))));
}

#[tokio::test]
async fn truncate_removes_a_suffix_and_purge_a_prefix_durably() {
    let fs = sim();
    let mut store = open(&fs);
    store.blocking_append(ents(1..=10)).await.unwrap();
    store.truncate(log_id(1, 1, 8)).await.unwrap();
    assert_eq!(indexes(&mut store).await, [1, 2, 3, 4, 5, 6, 7]);
    store.purge(log_id(1, 1, 3)).await.unwrap();
    assert_eq!(indexes(&mut store).await, [4, 5, 6, 7]);
    // A truncated suffix can be rewritten with another term.
    store.blocking_append([blank_ent::<T>(2, 2, 8)]).await.unwrap();
    drop(store);
    fs.crash(CrashMode::DropUnsynced);

    let mut store = open(&fs);
    assert_eq!(indexes(&mut store).await, [4, 5, 6, 7, 8]);
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 3)));
    assert_eq!(state.last_log_id, Some(log_id(2, 2, 8)));
    // Ranges read exactly what they name.
    let got = store.try_get_log_entries(5..7).await.unwrap();
    assert_eq!(got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), [5, 6]);

    // Purging everything leaves the purged id as the last log id.
    store.purge(log_id(2, 2, 8)).await.unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(
        (state.last_purged_log_id, state.last_log_id),
        (Some(log_id(2, 2, 8)), Some(log_id(2, 2, 8)))
    );
    assert!(indexes(&mut store).await.is_empty());
}

#[tokio::test]
async fn membership_entries_round_trip() {
    let fs = sim();
    let mut store = open(&fs);
    let m = membership_ent::<T>(1, 1, 1, vec![[1u64, 2, 3].into_iter().collect()]);
    store.blocking_append([m.clone()]).await.unwrap();
    drop(store);
    let mut store = open(&fs);
    let got = store.try_get_log_entries(1..=1).await.unwrap();
    assert_eq!(format!("{got:?}"), format!("{:?}", vec![m]));
}

#[tokio::test]
async fn a_damaged_entry_fails_the_open_instead_of_reaching_raft() {
    let fs = sim();
    let mut store = open(&fs);
    // A payload made of our own record magic must not confuse anything.
    let tricky = openraft::Entry::<T> {
        log_id: log_id(1, 1, 1),
        payload: openraft::EntryPayload::Normal("NRAF\u{1}NRAF".into()),
    };
    store.blocking_append([tricky]).await.unwrap();
    drop(store);
    let path = raft_log_path(&data_dir());
    // Find the body text in the file and flip one byte of it.
    let file = fs.open(&path, OpenMode::Existing).unwrap();
    let mut bytes = vec![0u8; file.len().unwrap() as usize];
    file.read_exact_at(&mut bytes, 0).unwrap();
    let at = bytes.windows(10).position(|w| w == b"NRAF\\u0001").expect("entry body in the file");
    fs.poke(&path, at as u64, b"X").unwrap();
    let err = LogStore::<T>::open(&fs, &data_dir()).unwrap_err();
    assert!(err.to_string().contains("log entry 1"), "{err}");
}

#[tokio::test]
async fn a_failed_fsync_latches_the_log() {
    let fs = sim();
    let mut store = open(&fs);
    store.blocking_append(ents(1..=2)).await.unwrap();
    fs.inject(fs.op_count(), FaultKind::SyncError);
    assert!(store.blocking_append(ents(3..=3)).await.is_err());
    // Later writes fail without touching the disk, reads keep working.
    let err = store.save_vote(&openraft::Vote::new(2, 1)).await.unwrap_err();
    assert!(err.to_string().contains("earlier failure"), "{err}");
    assert!(store.try_get_log_entries(1..=2).await.is_ok());
}

#[tokio::test]
async fn a_file_of_another_format_is_refused() {
    let fs = sim();
    drop(open(&fs));
    let path = raft_log_path(&data_dir());
    let db = open_database(fs.open(&path, OpenMode::Existing).unwrap()).unwrap();
    let txn = write_txn(&db).unwrap();
    txn.open_table(META).unwrap().insert(KEY_FORMAT, encode_value(&9u64).as_slice()).unwrap();
    txn.commit().unwrap();
    drop(db);
    let err = LogStore::<T>::open(&fs, &data_dir()).unwrap_err();
    assert!(err.to_string().contains("format version 9 is not supported"), "{err}");
}

/// A store whose purge floor the test moves.
fn open_with_floor(fs: &SimFs) -> (LogStore<T>, Arc<std::sync::atomic::AtomicU64>) {
    let floor = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let read = floor.clone();
    let store = open(fs).with_purge_floor(Box::new(move || {
        Some(read.load(std::sync::atomic::Ordering::SeqCst)).filter(|f| *f > 0)
    }));
    (store, floor)
}

#[tokio::test]
async fn a_purge_past_the_state_machines_applied_entry_waits_for_it_even_across_a_crash() {
    let fs = sim();
    let (mut store, floor) = open_with_floor(&fs);
    store.blocking_append(ents(1..=10)).await.unwrap();
    floor.store(3, std::sync::atomic::Ordering::SeqCst);
    // openraft asks for a purge to 8 (a snapshot being installed) while the
    // state machine has applied 3 durably.
    store.purge(log_id(1, 1, 8)).await.unwrap();
    assert_eq!(indexes(&mut store).await, [4, 5, 6, 7, 8, 9, 10]);
    drop(store);
    fs.crash(CrashMode::DropUnsynced);
    // A power loss before the install landed: the log still starts right
    // after the state machine's entry.
    let (mut store, floor) = open_with_floor(&fs);
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 3)));

    // Once the state machine has the entries, the next write purges them.
    store.purge(log_id(1, 1, 8)).await.unwrap();
    assert_eq!(indexes(&mut store).await, [4, 5, 6, 7, 8, 9, 10]);
    floor.store(8, std::sync::atomic::Ordering::SeqCst);
    store.save_vote(&openraft::Vote::new_committed(2, 1)).await.unwrap();
    assert_eq!(indexes(&mut store).await, [9, 10]);
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 8)));
}

#[tokio::test]
async fn an_append_past_a_held_back_purge_never_leaves_a_gap_in_the_log() {
    let fs = sim();
    let (mut store, floor) = open_with_floor(&fs);
    store.blocking_append(ents(1..=5)).await.unwrap();
    floor.store(2, std::sync::atomic::Ordering::SeqCst);
    store.purge(log_id(1, 1, 8)).await.unwrap();
    assert_eq!(indexes(&mut store).await, [3, 4, 5]);
    // openraft believes 1..=8 purged and appends 9: entries stay
    // contiguous, so the held-back purge is done with it.
    store.blocking_append(ents(9..=9)).await.unwrap();
    assert_eq!(indexes(&mut store).await, [9]);
    drop(store);
    fs.crash(CrashMode::DropUnsynced);
    let (mut store, _) = open_with_floor(&fs);
    let state = store.get_log_state().await.unwrap();
    assert_eq!(
        (state.last_purged_log_id, state.last_log_id),
        (Some(log_id(1, 1, 8)), Some(log_id(1, 1, 9)))
    );
}
