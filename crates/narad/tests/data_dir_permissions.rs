//! The data directory holds the password hashes (the metastore) and every
//! message: narad creates it and everything in it for its own user only
//! (directories 0700, files 0600, whatever the umask allows beyond), and
//! warns at start when an existing data directory is open to others.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::Server;

/// Every (path, mode) under `dir`, `dir` included.
fn modes(dir: &Path, out: &mut Vec<(String, u32, bool)>) {
    let meta = std::fs::metadata(dir).unwrap();
    out.push((dir.display().to_string(), meta.permissions().mode() & 0o777, true));
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            modes(&e.path(), out);
        } else if t.is_file() {
            let mode = e.metadata().unwrap().permissions().mode() & 0o777;
            out.push((e.path().display().to_string(), mode, false));
        }
    }
}

#[test]
fn the_data_dir_and_its_files_are_private_to_narads_user_and_an_open_one_is_warned_about() {
    let mut s = Server::start_secure("perms");
    let r = s.as_admin(reqwest::Method::POST, "/v1/topics").body(r#"{"name":"t"}"#).send().unwrap();
    assert_eq!(r.status(), 201);
    let r = s.as_admin(reqwest::Method::POST, "/v1/topics/t/produce").body("m").send().unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(s.terminate().code(), Some(0));
    let mut all = Vec::new();
    modes(&s.data_dir, &mut all);
    assert!(all.iter().any(|(p, _, dir)| !dir && p.contains("metastore")), "{all:?}");
    let open: Vec<_> = all.iter().filter(|(_, mode, _)| mode & 0o077 != 0).collect();
    assert!(open.is_empty(), "readable or writable by others: {open:?}");
    assert!(!s.log().contains("readable by other users"));
    // An existing data directory open to others starts, with a warning.
    std::fs::set_permissions(&s.data_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    s.restart();
    let log = s.log();
    assert!(log.contains("readable by other users"), "{log}");
}
