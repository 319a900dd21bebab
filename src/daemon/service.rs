//! The composition root: the service's shared parts, each built once here,
//! and what each component is handed of them. Components take only what
//! they use; none builds another's parts.

use std::sync::Arc;

use crate::api::conditions::Conditions;
use crate::api::metrics::Metrics;
use crate::api::{AppState, LastRounds, Served};
use crate::auth::AuthFailures;
use crate::check;
use crate::config::{Config, Live};
use crate::crawl::jobs::CrawlJobs;
use crate::gateway::{Gateway, GatewayMetrics};
use crate::health::Feedback;
use crate::pool::{Pool, PoolError, Verifier};
use crate::store::Store;

/// The service's shared parts over an opened store and its feedback path:
/// what `serve` runs, and what tests and benches build to serve the API
/// alone. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    /// The configuration the daemon started with.
    pub config: Arc<Config>,
    /// The configuration in force (see [`Live`]).
    pub live: Live,
    /// The durable record.
    pub store: Store,
    /// The one path verdicts take, and the index of servable proxies.
    pub feedback: Feedback,
    /// The process's one pool on `feedback`'s index: the gateway and every
    /// crawl job are clients of it, under its caps.
    pub pool: Pool,
    /// The checker of the latest round: the check loop sets it,
    /// `verifier` uses it.
    pub checker: check::Current,
    /// `verify=true`'s checks: a client of `pool` with `checker`, under
    /// `api.verify_per_minute`.
    pub verifier: Verifier,
    /// Crawl jobs, clients of `pool`: run by the daemon, served at
    /// `/crawls`.
    pub crawls: CrawlJobs,
    /// The counters `/metrics` shows.
    pub metrics: Arc<Metrics>,
    /// What the last harvest and check rounds did.
    pub rounds: LastRounds,
    /// What is degraded now, for `/healthz`.
    pub conditions: Arc<Conditions>,
    /// Wrong tokens per client address, for the API and the gateway
    /// together.
    pub auth: Arc<AuthFailures>,
    /// The gateway's counters, once [`Service::gateway`] built it.
    pub gateway: Option<Arc<GatewayMetrics>>,
}

impl Service {
    /// Every shared part over `store` and `feedback`, with `config`'s
    /// pool caps and crawl limits.
    pub fn new(store: Store, feedback: Feedback, config: Arc<Config>) -> Service {
        // With the built-in roots and user agent a pool always builds.
        let pool = Pool::shared(feedback.clone(), &config.pool)
            .expect("the default pool options are valid");
        let checker = check::Current::default();
        let verifier = Verifier::new(&pool, checker.clone(), config.api.verify_per_minute)
            .expect("the default pool options are valid");
        Service {
            crawls: CrawlJobs::new(store.clone(), pool.clone(), &config),
            pool,
            live: Live::new(config.clone()),
            store,
            feedback,
            checker,
            verifier,
            metrics: Arc::new(Metrics::new()),
            rounds: LastRounds::default(),
            conditions: Arc::default(),
            auth: Arc::default(),
            gateway: None,
            config,
        }
    }

    /// The gateway, a client of the pool counting wrong tokens with the
    /// API; its counters are shown in `/stats` and `/metrics` from now on.
    pub fn gateway(&mut self) -> Result<Gateway, PoolError> {
        let config = &self.config;
        let gateway = Gateway::sharing_auth(
            &self.pool,
            &config.gateway,
            config.api.max_age,
            self.auth.clone(),
        )?;
        let metrics = gateway.metrics();
        self.metrics.register_gateway(&metrics);
        self.gateway = Some(metrics);
        Ok(gateway)
    }

    /// The API's state: what it serves from.
    pub fn api(&self) -> AppState {
        AppState::new(Served {
            store: self.store.clone(),
            feedback: self.feedback.clone(),
            config: self.config.clone(),
            live: self.live.clone(),
            verifier: self.verifier.clone(),
            metrics: self.metrics.clone(),
            rounds: self.rounds.clone(),
            crawls: self.crawls.clone(),
            gateway: self.gateway.clone(),
            conditions: self.conditions.clone(),
            auth: self.auth.clone(),
        })
    }
}
