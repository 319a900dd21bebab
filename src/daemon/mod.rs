//! `serve`: the daemon's components (the API, the gateway, the check loop,
//! harvests on the cron schedule, the daily purge, crawl jobs, the watch on
//! the store's writes, the dashboard's snapshots, the systemd watchdog), each a task
//! on one tracker, started together and stopped together. [`Service`] is the
//! composition root: it builds the shared parts, and each component gets
//! only those it uses.

mod checks;
mod cron;
mod harvest;
mod outage;
mod purge;
mod reload;
mod service;
mod snapshots;
mod sync;
mod systemd;
mod writes;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api;
use crate::config::{Config, Schedule};
use crate::gateway::{self, Gateway};
use crate::health::{self, Feedback};
use crate::store::Store;
use checks::CheckLoop;
use harvest::Harvester;
use purge::Purger;
pub use service::Service;
use sync::IndexSync;
use writes::WriteWatch;

/// How long checks in flight may run after shutdown begins before they are
/// stopped (their results are then not recorded).
const CHECK_GRACE: Duration = Duration::from_secs(5);
/// How long every component together may take to
/// stop: with the binary's one second for blocking work (`main.rs`), an exit
/// within 10 s of SIGTERM, well inside the unit's TimeoutStopSec, whatever
/// is in flight.
const STOP_LIMIT: Duration = Duration::from_secs(8);
/// When the daily purge runs (03:17:00 UTC).
const PURGE_SCHEDULE: &str = "0 17 3 * * *";

/// Runs the daemon on an already bound API listener (and the gateway's,
/// when it runs) until `shutdown` is cancelled. Every component (API,
/// gateway, check loop, harvests, purge, the index sync, the write watch,
/// watchdog) is a task on one tracker; the cron tasks only signal the harvest
/// and purge components. On shutdown every component is cancelled, checks
/// in flight get `CHECK_GRACE`, and the whole stop takes at most
/// `STOP_LIMIT`.
pub async fn run(
    config: Config,
    listener: TcpListener,
    gateway: Option<TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (_keep, reloads) = mpsc::channel(1);
    run_reloading(config, listener, gateway, shutdown, reloads).await
}

/// [`run`], putting in force each config `reloads` brings (read again on
/// SIGHUP, and valid): what can change at run time takes effect, the rest
/// is named in the log as needing a restart (see `reload`).
pub async fn run_reloading(
    config: Config,
    listener: TcpListener,
    gateway: Option<TcpListener>,
    shutdown: CancellationToken,
    reloads: mpsc::Receiver<Config>,
) -> anyhow::Result<()> {
    let file = config.clone();
    let mut config = config;
    // The addresses actually bound (a port of 0 in the config, or a
    // listener handed in, picks its own): what the harvest must never store
    // as a proxy, and what `Host` may name.
    config.api.listen = listener.local_addr()?;
    if let Some(gateway) = &gateway {
        config.gateway.listen = gateway.local_addr()?;
    }
    // One id for the process's life, whatever derives it.
    config.node.id = Some(config.node.id());
    let config = Arc::new(config);
    let store = Store::open_configured(&config.database).await?;
    // Read before the index, so rows changed while it loads are read again.
    let mark = store.change_seq().await?;
    let index = health::load_index(&store)
        .await
        .context("loading the health index")?;
    let feedback = Feedback::new(index.clone(), store.clone());
    // What was loaded is served only while its last check is fresh, from
    // the first request on, and is re-checked at once: it may have died
    // since another process checked it. Until then, what has passed a
    // check since the start is served first. Bans sites made and the
    // proxies they took come back from earlier runs.
    let window = config.check.fresh_window(index.len());
    match feedback.serve_loaded(window, crate::store::now_ms()).await {
        Ok(0) => {}
        Ok(pairs) => tracing::debug!(pairs, "what sites taught about proxies loaded"),
        Err(e) => tracing::warn!(error = %e, "cannot load what sites taught about proxies"),
    }
    let mut service = Service::new(store.clone(), feedback.clone(), config.clone());
    let gateway = match gateway {
        Some(listener) => {
            let gw = service.gateway().context("setting up the gateway")?;
            tracing::info!(addr = %listener.local_addr()?, "gateway listening");
            Some(GatewayComponent {
                listener,
                gateway: gw,
            })
        }
        None => None,
    };
    let addr = listener.local_addr()?;
    tracing::info!(
        %addr,
        servable = index.len(),
        node = config.node.id.as_deref().unwrap_or_default(),
        database = %config.database.shown(),
        "proxywarden serving"
    );

    let (harvest_tx, harvest_rx) = mpsc::channel(1);
    let (purge_tx, purge_rx) = mpsc::channel(1);

    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    let harvest_cron = stop.child_token();
    reload::schedule_harvest(
        &tasks,
        config.harvest.schedule.clone(),
        harvest_tx.clone(),
        harvest_cron.clone(),
    );
    let purge_schedule = Schedule::parse(PURGE_SCHEDULE).context("the purge's schedule")?;
    cron::spawn(&tasks, purge_schedule, stop.clone(), move || {
        let _ = purge_tx.try_send(());
    });
    let abort_checks = CancellationToken::new();
    {
        let (state, stop) = (service.api(), stop.clone());
        tasks.spawn(async move {
            if let Err(e) = api::serve(listener, state, stop).await {
                tracing::error!(error = %e, "the API stopped serving");
            }
        });
    }
    if let Some(gateway) = gateway {
        tasks.spawn(gateway.run(stop.clone()));
    }
    tasks.spawn(
        CheckLoop {
            config: config.clone(),
            store: store.clone(),
            live: service.live.clone(),
            feedback: feedback.clone(),
            checker: service.checker.clone(),
            metrics: service.metrics.clone(),
            rounds: service.rounds.clone(),
            conditions: service.conditions.clone(),
            abort: abort_checks.clone(),
        }
        .run(stop.clone()),
    );
    tasks.spawn(
        Harvester {
            config: config.clone(),
            store: store.clone(),
            live: service.live.clone(),
            feedback: feedback.clone(),
            metrics: service.metrics.clone(),
            rounds: service.rounds.clone(),
            triggers: harvest_rx,
            worked_before: false,
        }
        .run(stop.clone()),
    );
    tasks.spawn(
        Purger {
            config: config.clone(),
            store: store.clone(),
            triggers: purge_rx,
            rounds: service.rounds.clone(),
        }
        .run(stop.clone()),
    );
    tasks.spawn(
        IndexSync {
            store: store.clone(),
            feedback: feedback.clone(),
            mark,
        }
        .run(stop.clone()),
    );
    tasks.spawn(
        WriteWatch {
            store: store.clone(),
            conditions: service.conditions.clone(),
            feedback: feedback.clone(),
        }
        .run(stop.clone()),
    );
    tasks.spawn(service.crawls.clone().run(stop.clone()));
    tasks.spawn(
        snapshots::Snapshots {
            store: store.clone(),
            feedback: feedback.clone(),
            config: config.clone(),
            metrics: service.metrics.clone(),
            gateway: service.gateway.clone(),
        }
        .run(stop.clone()),
    );
    tasks.spawn(
        reload::Reloader {
            live: service.live.clone(),
            file,
            configs: reloads,
            tasks: tasks.clone(),
            stop: stop.clone(),
            harvest_cron,
            harvest: harvest_tx,
        }
        .run(stop.clone()),
    );
    tasks.spawn(systemd::watchdog(stop.clone()));
    tasks.spawn(systemd::status(index.clone(), stop.clone()));
    tasks.close();
    systemd::notify(&[sd_notify::NotifyState::Ready]);

    shutdown.cancelled().await;
    tracing::info!("shutting down");
    systemd::notify(&[sd_notify::NotifyState::Stopping]);
    stop.cancel();
    let stopped = async {
        tokio::select! {
            _ = tasks.wait() => {}
            _ = tokio::time::sleep(CHECK_GRACE) => {
                abort_checks.cancel();
                tasks.wait().await;
            }
        }
    };
    let stopped = async {
        stopped.await;
        // Worked uses are written in batches: the last one before the store
        // closes.
        if let Err(e) = feedback.flush().await {
            tracing::warn!(error = %e, "cannot record proxies' worked uses");
        }
        // The database file alone then holds everything (a copy of it is
        // a whole backup).
        if let Err(e) = store.checkpoint().await {
            tracing::warn!(error = %e, "cannot copy the write-ahead log into the database");
        }
    };
    if tokio::time::timeout(STOP_LIMIT, stopped).await.is_err() {
        tracing::warn!(
            unfinished = tasks.len(),
            "components did not stop in time; exiting anyway"
        );
    }
    tracing::info!("stopped");
    Ok(())
}

/// The gateway on its listener.
struct GatewayComponent {
    listener: TcpListener,
    gateway: Gateway,
}

impl GatewayComponent {
    async fn run(self, stop: CancellationToken) {
        if let Err(e) = gateway::serve(self.listener, self.gateway, stop).await {
            tracing::error!(error = %e, "the gateway stopped serving");
        }
    }
}
