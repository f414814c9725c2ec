//! Crash points for the fault-matrix tests. With `STICKY_FAULT=<name>` in
//! its environment, a debug build kills itself with SIGKILL when it reaches
//! the point of that name, exactly as `kill -9` at that instant would. In
//! release builds `point` is empty, so the variable does nothing there.

/// Every point, in the order an ADD or a DEL passes them; the fault-matrix
/// test walks this list, so a point added to the code and not here is
/// never exercised.
pub const POINTS: &[&str] = &[
    ADD_LINK_CREATED,
    ADD_LINK_RENAMED,
    ADD_IDENTITY_RECORDED,
    ADD_CLAIM_WRITTEN,
    ADD_PROBED,
    ADD_ADDRESS_SET,
    ADD_ROUTES_SET,
    ADD_DONE,
    DEL_CLAIM_RELEASED,
    DEL_LINK_REMOVED,
];

/// The macvlan exists under its temporary name in the pod netns.
pub const ADD_LINK_CREATED: &str = "add-link-created";
/// ... and has the pod's interface name.
pub const ADD_LINK_RENAMED: &str = "add-link-renamed";
/// The identity's index entry is durable, its claim not yet written (file
/// store); the claim object exists, not yet verified unique (kubernetes).
pub const ADD_IDENTITY_RECORDED: &str = "add-identity-recorded";
/// The claim naming this holder is committed.
pub const ADD_CLAIM_WRITTEN: &str = "add-claim-written";
/// The ARP probe (when one runs) found the address free.
pub const ADD_PROBED: &str = "add-probed";
pub const ADD_ADDRESS_SET: &str = "add-address-set";
pub const ADD_ROUTES_SET: &str = "add-routes-set";
/// Everything is wired; the result is not printed yet.
pub const ADD_DONE: &str = "add-done";
pub const DEL_CLAIM_RELEASED: &str = "del-claim-released";
pub const DEL_LINK_REMOVED: &str = "del-link-removed";

#[inline]
pub fn point(name: &str) {
    #[cfg(debug_assertions)]
    if std::env::var("STICKY_FAULT").is_ok_and(|wanted| wanted == name) {
        // SAFETY: signalling ourselves; SIGKILL cannot be caught, so
        // nothing runs after this, as with an external kill -9.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}
