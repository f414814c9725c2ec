use super::*;
use crate::claim::Holder;
use crate::store::Change;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "sticky-ipam-test-{tag}-{}-{}",
        std::process::id(),
        crate::claim::now_secs()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn claim(ip: &str, id: &str, holder: Option<&str>) -> Claim {
    Claim {
        ip: ip.parse().unwrap(),
        identity: id.into(),
        sticky: true,
        holder: holder.map(|c| Holder {
            container_id: c.into(),
            ifname: "net1".into(),
            netns: String::new(),
            netns_id: None,
            pod_namespace: None,
            pod_name: None,
            pod_uid: None,
            node: "n".into(),
            boot_id: "b".into(),
            since: 1,
        }),
        owner: None,
        namespace: None,
        created: 1,
        updated: 1,
        unconfirmed: None,
    }
}

fn put(c: Claim) -> Plan {
    Plan {
        changes: vec![Change {
            before: None,
            after: Some(c),
        }],
        cursors: vec![],
    }
}

#[test]
fn round_trip_with_indexes() {
    let dir = tmpdir("rt");
    let mut s = FileStore::open(&dir, "net").unwrap();
    let c = claim("10.0.0.5", "../../etc/passwd", Some("c1"));
    s.commit(&put(c.clone())).unwrap();
    assert_eq!(s.claim(c.ip).unwrap(), Some(c.clone()));
    assert_eq!(
        s.claims_of_identity("../../etc/passwd").unwrap(),
        vec![c.clone()]
    );
    assert_eq!(s.claims_of_holder("c1", "net1").unwrap(), vec![c.clone()]);
    assert!(!dir.join("net/identities/../../etc").exists());
    // Holder moves: the old holder's index no longer finds it.
    let moved = claim("10.0.0.5", "../../etc/passwd", Some("c2"));
    s.commit(&Plan {
        changes: vec![Change {
            before: Some(c.clone()),
            after: Some(moved.clone()),
        }],
        cursors: vec![(0, c.ip)],
    })
    .unwrap();
    assert!(s.claims_of_holder("c1", "net1").unwrap().is_empty());
    assert_eq!(
        s.claims_of_holder("c2", "net1").unwrap(),
        vec![moved.clone()]
    );
    assert_eq!(s.cursor(0).unwrap(), Some(c.ip));
    // Delete: nothing is left in any index.
    s.commit(&Plan {
        changes: vec![Change {
            before: Some(moved),
            after: None,
        }],
        cursors: vec![],
    })
    .unwrap();
    assert!(s.list().unwrap().claims.is_empty());
    assert_eq!(
        std::fs::read_dir(dir.join("net/identities"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(dir.join("net/holders")).unwrap().count(),
        0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_contended_lock_is_handed_over_when_released() {
    let dir = tmpdir("lock");
    let first = FileStore::open(&dir, "net").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let d = dir.clone();
    let waiter = std::thread::spawn(move || {
        let opened = FileStore::open(&d, "net");
        let _ = tx.send(opened.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        // Hold the store until the main thread has looked.
        let _ = done_rx.recv();
        drop(opened);
    });
    // Still waiting while the first store holds the lock...
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    drop(first);
    // ...and through as soon as it is released.
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("lock handed over");
    assert!(got.is_ok());
    // The lock the helper thread took stays with the store after that
    // thread is gone: a third party cannot take it.
    let probe = File::open(dir.join("net/lock")).unwrap();
    assert!(
        !try_lock(&probe, &dir).unwrap(),
        "the handed-over lock was lost"
    );
    done_tx.send(()).unwrap();
    waiter.join().unwrap();
    assert!(try_lock(&probe, &dir).unwrap(), "released with the store");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_records_are_named_not_guessed() {
    let dir = tmpdir("dmg");
    let mut s = FileStore::open(&dir, "net").unwrap();
    s.commit(&put(claim("10.0.0.6", "a", None))).unwrap();
    let claims = dir.join("net/claims");
    std::fs::write(claims.join("10.0.0.7"), b"{\"ip\": \"10.0.0.7\", \"iden").unwrap();
    std::fs::write(claims.join("10.0.0.8"), b"").unwrap();
    std::fs::write(claims.join("README"), b"hello").unwrap();
    std::fs::copy(claims.join("10.0.0.6"), claims.join("10.0.0.9")).unwrap();
    let e = s.claim("10.0.0.7".parse().unwrap()).unwrap_err();
    assert!(matches!(e, StoreError::Damaged(_)), "{e:?}");
    assert!(
        e.message().contains("10.0.0.7") && e.message().contains("damaged"),
        "{e}"
    );
    let listing = s.list().unwrap();
    assert_eq!(listing.claims.len(), 1);
    let names: Vec<String> = listing
        .damaged
        .iter()
        .map(|d| d.path.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    let mismatch = listing
        .damaged
        .iter()
        .find(|d| d.path.ends_with("10.0.0.9"))
        .unwrap();
    assert!(mismatch.why.contains("names 10.0.0.6"), "{}", mismatch.why);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn symlinked_records_are_not_followed() {
    let dir = tmpdir("link");
    let mut s = FileStore::open(&dir, "net").unwrap();
    let outside = dir.join("outside");
    std::fs::write(&outside, b"{}").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("net/claims/10.0.0.9")).unwrap();
    assert!(s.claim("10.0.0.9".parse().unwrap()).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn permissions_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmpdir("perm");
    let mut s = FileStore::open(&dir, "net").unwrap();
    s.commit(&put(claim("10.0.0.6", "a", Some("c")))).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.join("net/claims")), 0o700);
    assert_eq!(mode(&dir.join("net/claims/10.0.0.6")), 0o600);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_range_sets_of_one_family_give_an_identity_one_address_in_each() {
    // The file store keys claims by address, not by (identity, family),
    // so it keeps two IPv4 sets apart; the kubernetes store refuses them
    // (config::one_set_per_family).
    use crate::engine::{plan_add, AddRequest};
    use crate::identity::{Identity, IdentitySource};
    use crate::liveness::{Caller, Inspector, Verdict};
    struct Dead;
    impl Inspector for Dead {
        fn verdict(&self, _: &Holder, _: Option<&Caller>) -> Verdict {
            Verdict::Dead("gone".into())
        }
    }
    let req = |cid: &str| AddRequest {
        identity: Identity {
            key: "peer".into(),
            sticky: true,
            source: IdentitySource::ArgsCni,
            owner: None,
        },
        holder: claim("10.0.0.1", "peer", Some(cid)).holder.unwrap(),
        caller: Caller { pod_uid: None },
        requested: vec![],
        now: 100,
    };
    let c = crate::config::IpamConfig::parse(
        "net",
        &serde_json::json!({"ranges": [
            [{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.11"}],
            [{"subnet": "10.0.1.0/24", "rangeStart": "10.0.1.10", "rangeEnd": "10.0.1.11"}]
        ]}),
    )
    .unwrap();
    let d = tmpdir("two-v4-sets");
    let mut s = FileStore::open(&d, "net").unwrap();
    let ips = |g: &[crate::engine::Grant]| g.iter().map(|g| g.ip.to_string()).collect::<Vec<_>>();
    let (plan, first) = plan_add(&c, &mut s, &Dead, &req("c1")).unwrap();
    s.commit(&plan).unwrap();
    assert_eq!(ips(&first), ["10.0.0.10", "10.0.1.10"]);
    // A new sandbox of the same identity gets the same two addresses.
    let (plan, again) = plan_add(&c, &mut s, &Dead, &req("c2")).unwrap();
    s.commit(&plan).unwrap();
    assert_eq!(ips(&again), ips(&first));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn release_file_refuses_a_readable_claim_and_keeps_a_damaged_ones_address_marked() {
    // Found by review: `release --file` deleted any record, so a live
    // claim's address (or one whose holder a damaged record hid) was next
    // handed out fresh, unprobed.
    let dir = tmpdir("relfile");
    let mut s = FileStore::open(&dir, "net").unwrap();
    let held = claim("10.0.0.5", "live", Some("c1"));
    s.commit(&Plan {
        changes: vec![Change {
            before: None,
            after: Some(held),
        }],
        cursors: vec![],
    })
    .unwrap();
    let e = s.remove_record("10.0.0.5").unwrap_err();
    assert!(e.to_string().contains("release --ip 10.0.0.5"), "{e}");
    assert!(s.claim("10.0.0.5".parse().unwrap()).unwrap().is_some());
    std::fs::write(dir.join("net/claims/10.0.0.6"), b"{not json").unwrap();
    s.remove_record("10.0.0.6").unwrap();
    let stone = s.claim("10.0.0.6".parse().unwrap()).unwrap().unwrap();
    assert!(stone.is_tombstone(), "{stone:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
