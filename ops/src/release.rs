//! `release`: an operator's word that a claim may go, refused while its
//! holder is alive unless forced; `--file` removes a damaged record.

use cni::{CniError, CniResult};
use sticky_ipam::backend::Backend;
use sticky_ipam::claim::{now_secs, Claim};
use sticky_ipam::engine::{plan_release, ReleaseTarget};
use sticky_ipam::store::file::FileStore;
use sticky_ipam::store::retry::with_retries;
use sticky_ipam::store::ClaimStore;

use crate::judge::Judge;
use crate::options::Opts;

pub fn run(opts: &Opts) -> CniResult<()> {
    let network = opts.network("release")?;
    let backend = opts.backend()?;
    opts.networks(&backend)?;
    if let Some(name) = opts.values.get("--file") {
        let Backend::File { dir, .. } = &backend else {
            return Err(CniError::invalid_config(
                "release --file is for damaged file-store records; in the kubernetes store delete the IPClaim with kubectl",
            ));
        };
        let mut store = FileStore::open(dir, &network)?;
        store.remove_record(name)?;
        store.rebuild_indexes()?;
        println!("removed record {name} of network {network} and rebuilt its indexes");
        return Ok(());
    }
    let target =
        match (opts.values.get("--ip"), opts.values.get("--identity")) {
            (Some(ip), None) => ReleaseTarget::Address(ip.parse().map_err(|_| {
                CniError::invalid_config(format!("--ip {ip:?} is not an IP address"))
            })?),
            (None, Some(id)) => ReleaseTarget::Identity(id.clone()),
            _ => {
                return Err(CniError::invalid_config(
                    "release needs exactly one of --ip IP, --identity ID or --file NAME",
                ))
            }
        };
    let judge = opts.judge(&backend)?;
    eprintln!("release: verdicts from {}", judge.describe());
    let mut store = backend.open(&network, vec![])?;
    let released = release_on(&mut store, &judge, &network, &target, opts.flag("--force"))?;
    for c in &released {
        println!(
            "released {} (identity {:?}) on network {network}",
            c.ip, c.identity
        );
    }
    Ok(())
}

/// Releases `target` of `network` in `store`, refused while its holder is
/// alive unless `force`.
pub(crate) fn release_on(
    store: &mut dyn ClaimStore,
    judge: &Judge,
    network: &str,
    target: &ReleaseTarget,
    force: bool,
) -> CniResult<Vec<Claim>> {
    // Each attempt judges with lookups of its own.
    let (_, released) = with_retries(store, "release", |s| {
        plan_release(
            s,
            judge.inspector().as_ref(),
            network,
            target,
            force,
            now_secs(),
        )
    })?;
    Ok(released)
}
