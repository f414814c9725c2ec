//! `reconcile`: one sweep, or one every `--interval`, that releases the
//! holders liveness confirms dead, unlocks orphan locks, retires what the
//! networks' retention gives up, and with `--metrics-addr` serves the
//! metrics of what it saw.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cni::{CniError, CniResult};
use sticky_ipam::backend::{Backend, Store};
use sticky_ipam::claim::now_secs;
use sticky_ipam::engine::{plan_reconcile, plan_retire, Released};
use sticky_ipam::store::ipclaim::ORPHAN_LOCK_GRACE_SECS;
use sticky_ipam::store::retry::with_retries;
use sticky_ipam::store::{ClaimStore, Plan, PlanError, PlanResult, StoreError, StoreResult};

use crate::admin::AdminApi;
use crate::claims::state;
use crate::judge::Judge;
use crate::options::Opts;
use crate::{metrics, stop};

pub fn run(opts: &Opts) -> CniResult<()> {
    let interval = match opts.values.get("--interval") {
        None => None,
        Some(s) => match s.parse::<u64>() {
            Ok(n) if n > 0 => Some(Duration::from_secs(n)),
            _ => {
                return Err(CniError::invalid_config(format!(
                    "--interval {s:?} must be a whole number of seconds, at least 1"
                )))
            }
        },
    };
    let backend = opts.backend()?;
    let judge = opts.judge(&backend)?;
    eprintln!("reconcile: verdicts from {}", judge.describe());
    let retire = backend.is_kube() && !opts.flag("--keep-retired");
    let mut metrics = metrics::Metrics::default();
    let page = Arc::new(Mutex::new(metrics.render()));
    // The gauges cost a listing of each network and two cluster-wide
    // listings per sweep: made only when someone can read them.
    let serving = opts.values.get("--metrics-addr");
    if let Some(addr) = serving {
        metrics::serve(addr, page.clone()).map_err(|e| {
            CniError::io(format!(
                "cannot serve metrics on {addr}: {e}: pass a free ADDR:PORT to --metrics-addr"
            ))
        })?;
        eprintln!("reconcile: metrics at http://{addr}/metrics");
    }
    if interval.is_some() {
        stop::install();
    }
    loop {
        let t0 = Instant::now();
        let gauges = serving.is_some();
        let swept = sweep(opts, &backend, &judge, retire, gauges, &mut metrics);
        let api_failed = matches!(&swept, Err(e) if e.code == cni::code::STORE_UNREACHABLE || e.code == cni::code::STORE_REFUSED);
        if api_failed {
            metrics.api_error();
        }
        metrics.swept(t0.elapsed().as_secs_f64(), swept.is_ok());
        if let Ok(mut p) = page.lock() {
            *p = metrics.render();
        }
        match (interval, swept) {
            (None, outcome) => return outcome,
            (Some(d), outcome) => {
                if let Err(e) = outcome {
                    eprintln!(
                        "reconcile: this sweep failed, the next runs in {} s: {}",
                        d.as_secs(),
                        e.msg
                    );
                }
                if stop::sleep_unless_stopped(d) {
                    eprintln!("reconcile: stopped by a signal, between sweeps");
                    return Ok(());
                }
            }
        }
    }
}

/// One sweep over every network; counts its releases in `metrics`, and
/// with `gauges` also reads what the metrics' gauges and Event counters
/// need.
fn sweep(
    opts: &Opts,
    backend: &Backend,
    judge: &Judge,
    retire: bool,
    gauges: bool,
    metrics: &mut metrics::Metrics,
) -> CniResult<()> {
    let networks = opts.networks(backend)?;
    let open = |network: &str| backend.open(network, vec![]);
    let mut tally = sweep_networks(&networks, &open, judge, retire, gauges, metrics)?;
    if !gauges {
        summary(&networks, &tally);
        return Ok(());
    }
    if let Backend::Kube {
        client: Ok(client), ..
    } = backend
    {
        // Best effort: a listing that fails keeps the last figures.
        match client.nad_configs() {
            Ok(configs) => {
                for (network, size) in metrics::ranges_of(&configs) {
                    tally.figures.entry(network).or_default().range = Some(size);
                }
            }
            Err(e) => {
                metrics.api_error();
                eprintln!("reconcile: metrics: {e}");
                for (network, last) in &metrics.networks {
                    if let Some(range) = last.range {
                        tally.figures.entry(network.clone()).or_default().range = Some(range);
                    }
                }
            }
        }
        match client.our_events() {
            Ok(events) => metrics.observe_events(&events),
            Err(e) => {
                metrics.api_error();
                eprintln!("reconcile: metrics: {e}");
            }
        }
    }
    metrics.networks = std::mem::take(&mut tally.figures);
    summary(&networks, &tally);
    Ok(())
}

/// What a sweep did, for its summary line and the metrics' gauges.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) released: usize,
    pub(crate) retired: usize,
    pub(crate) alive: usize,
    /// Networks skipped after losing every race (the next sweep sees them).
    pub(crate) raced: Vec<String>,
    pub(crate) figures: BTreeMap<String, metrics::NetworkGauges>,
}

/// The sweep's work on each network's store (`open`): release dead
/// holders, unlock orphan locks, retire (with `retire`), and with `gauges`
/// count the network's claims by state. Every plan, and every attempt of
/// one, judges with a new inspector: a pod looked up for one network, or
/// before a lost race, may have been re-created since.
pub(crate) fn sweep_networks<'a>(
    networks: &[String],
    open: &dyn Fn(&str) -> StoreResult<Store<'a>>,
    judge: &Judge<'a>,
    retire: bool,
    gauges: bool,
    metrics: &mut metrics::Metrics,
) -> CniResult<Tally> {
    let mut tally = Tally::default();
    for network in networks {
        let mut store = open(network)?;
        let swept = with_retries(&mut store, "reconcile", |s| {
            let (plan, gone, live) = plan_reconcile(s, judge.inspector().as_ref(), now_secs())?;
            Ok((plan, (gone, live)))
        });
        match sweep_outcome(swept, network, "released")? {
            Some((gone, live)) => {
                tally.released += gone.len();
                metrics.released(network, gone.len() as u64);
                tally.alive += live;
            }
            None => tally.raced.push(network.clone()),
        }
        if let Store::Kube(kube) = &mut store {
            let swept = kube.sweep_locks(ORPHAN_LOCK_GRACE_SECS)?;
            for ip in swept.freed {
                println!("{network}: unlocked {ip}: an ADD left its lock and no claim more than {ORPHAN_LOCK_GRACE_SECS} s ago");
            }
            for ip in swept.cleared {
                println!("{network}: cleared the mark of the lock on {ip}: the claim naming it carries none");
            }
        }
        if retire {
            let swept = with_retries(&mut store, "retire", |s| {
                let (plan, out) = plan_retire(s, judge.inspector().as_ref(), now_secs())?;
                Ok((plan, (out, 0)))
            });
            match sweep_outcome(swept, network, "retired")? {
                Some((out, _)) => tally.retired += out.len(),
                None => tally.raced.push(network.clone()),
            }
        }
        if !gauges {
            continue;
        }
        let mut g = metrics::NetworkGauges::default();
        let inspector = judge.inspector();
        for c in &store.list()?.claims {
            match state(c, inspector.as_ref()).0 {
                "held" => g.held += 1,
                "dead" => g.dead += 1,
                "released" => g.released += 1,
                _ => g.reserved += u64::from(c.sticky),
            }
        }
        tally.figures.insert(network.clone(), g);
    }
    Ok(tally)
}

/// The sweep's summary line.
fn summary(networks: &[String], tally: &Tally) {
    let Tally {
        released,
        retired,
        alive,
        raced,
        ..
    } = tally;
    println!(
        "reconcile: {} networks, {released} dead holders released, {retired} sticky claims of deleted StatefulSets retired, {alive} live holders kept{}",
        networks.len(),
        if raced.is_empty() {
            String::new()
        } else {
            format!(", {} skipped after a concurrent change (next sweep): {}", raced.len(), raced.join(", "))
        }
    );
}

/// Prints what one sweep of a network changed; None when it kept losing
/// races (or the store stayed locked): the next sweep sees the new state.
fn sweep_outcome(
    swept: PlanResult<(Plan, (Vec<Released>, usize))>,
    network: &str,
    verb: &str,
) -> CniResult<Option<(Vec<Released>, usize)>> {
    match swept {
        Ok((_, (what, live))) => {
            for r in &what {
                println!(
                    "{network}: {verb} {} of identity {:?}: {}",
                    r.ip, r.identity, r.why
                );
            }
            Ok(Some((what, live)))
        }
        Err(PlanError::Store(StoreError::Busy(_))) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
