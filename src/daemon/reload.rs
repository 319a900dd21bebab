//! Reloading the configuration while `serve` runs (SIGHUP): what can change
//! at run time (the sources, `[harvest]` with its schedule, `[check]` with
//! its judges and limits, the API's token and allowed hosts) takes effect
//! and is named in the log; what needs a restart (listen addresses, the
//! database, …) is named too, and keeps its running value. A file with
//! errors never gets here: the caller logs them and keeps what runs.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, Live, Schedule};

use super::harvest::Trigger;

/// What a reload changes, by setting name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Settings that changed and took effect.
    pub applied: Vec<String>,
    /// Settings that changed but need a restart: their running values
    /// are kept.
    pub restart: Vec<&'static str>,
}

/// `new` (a file just read) over `file` (the file in force): the config to
/// put in force, and what changed. Settings that need a restart keep
/// `file`'s values.
pub fn merge(file: &Config, mut new: Config) -> (Config, Changes) {
    let mut changes = Changes::default();
    macro_rules! restart {
        ($($name:literal => $($field:ident).+;)*) => {$(
            if new.$($field).+ != file.$($field).+ {
                changes.restart.push($name);
                new.$($field).+ = file.$($field).+.clone();
            }
        )*};
    }
    restart! {
        "database" => database;
        "api.listen" => api.listen;
        "api.max_age" => api.max_age;
        "api.judge" => api.judge;
        "api.judge_per_minute" => api.judge_per_minute;
        "api.request_timeout" => api.request_timeout;
        "api.header_timeout" => api.header_timeout;
        "api.idle_timeout" => api.idle_timeout;
        "api.max_connections" => api.max_connections;
        "gateway" => gateway;
        "pool" => pool;
        "crawls" => crawls;
        "geoip" => geoip;
        "node" => node;
    }
    changes.applied.extend(sources_changed(file, &new));
    if new.harvest.schedule != file.harvest.schedule {
        changes.applied.push("harvest.schedule".into());
    }
    let mut harvest = new.harvest.clone();
    harvest.schedule = file.harvest.schedule.clone();
    if harvest != file.harvest {
        changes.applied.push("harvest".into());
    }
    if new.check.judges != file.check.judges {
        let urls: Vec<String> = new.check.judges.iter().map(|j| j.shown()).collect();
        changes
            .applied
            .push(format!("check.judges ({})", urls.join(", ")));
    }
    let mut check = new.check.clone();
    check.judges = file.check.judges.clone();
    if check != file.check {
        changes.applied.push("check".into());
    }
    if new.api.token != file.api.token {
        changes.applied.push("api.token".into());
    }
    if new.api.allowed_hosts != file.api.allowed_hosts {
        changes.applied.push("api.allowed_hosts".into());
    }
    if new.log != file.log {
        changes.applied.push(format!(
            "log.level ({})",
            new.log.level.as_deref().unwrap_or("as at start")
        ));
    }
    (new, changes)
}

/// The sources `new` adds, removes and changes against `file`, as
/// `sources (added: a; removed: b; changed: c)`, when any.
fn sources_changed(file: &Config, new: &Config) -> Option<String> {
    let old = |name: &str| file.sources.iter().find(|s| s.name == name);
    let added: Vec<&str> = new
        .sources
        .iter()
        .filter(|s| old(&s.name).is_none())
        .map(|s| s.name.as_str())
        .collect();
    let removed: Vec<&str> = file
        .sources
        .iter()
        .filter(|s| !new.sources.iter().any(|n| n.name == s.name))
        .map(|s| s.name.as_str())
        .collect();
    let changed: Vec<&str> = new
        .sources
        .iter()
        .filter(|s| old(&s.name).is_some_and(|o| o != *s))
        .map(|s| s.name.as_str())
        .collect();
    let mut parts = Vec::new();
    for (what, names) in [("added", added), ("removed", removed), ("changed", changed)] {
        if !names.is_empty() {
            parts.push(format!("{what}: {}", names.join(", ")));
        }
    }
    (!parts.is_empty()).then(|| format!("sources ({})", parts.join("; ")))
}

/// The cron task that asks for a harvest on `schedule`, until `stop`.
pub(super) fn schedule_harvest(
    tasks: &TaskTracker,
    schedule: Schedule,
    harvest: mpsc::Sender<Trigger>,
    stop: CancellationToken,
) {
    super::cron::spawn(tasks, schedule, stop, move || {
        if harvest.try_send(Trigger::Schedule).is_err() {
            tracing::info!("harvest still running; this slot joins the next run");
        }
    });
}

/// The reload component: puts each config read on SIGHUP in force.
pub(super) struct Reloader {
    /// Where the config in force lives.
    pub live: Live,
    /// The file in force (as read, before the daemon filled in the
    /// addresses it bound and its node id).
    pub file: Config,
    /// Configs read on SIGHUP, valid.
    pub configs: mpsc::Receiver<Config>,
    /// Where the harvest's cron task runs, and what stops the daemon.
    pub tasks: TaskTracker,
    pub stop: CancellationToken,
    /// Stops the harvest's cron task, replaced when the schedule changes.
    pub harvest_cron: CancellationToken,
    /// What the harvest job triggers.
    pub harvest: mpsc::Sender<Trigger>,
}

impl Reloader {
    /// Applies configs as they come, until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            let new = tokio::select! {
                _ = stop.cancelled() => return,
                new = self.configs.recv() => match new {
                    Some(new) => new,
                    None => return,
                },
            };
            self.apply(new).await;
        }
    }

    async fn apply(&mut self, new: Config) {
        let (file, changes) = merge(&self.file, new);
        for setting in &changes.restart {
            tracing::warn!(
                setting,
                "changed in the config file, but takes effect only after a restart; \
                 the running value is kept"
            );
        }
        if file.log != self.file.log
            && let Err(e) = crate::log_level::set(file.log.level.as_deref())
        {
            tracing::error!(error = %e, "cannot change the log level");
        }
        if file.harvest.schedule != self.file.harvest.schedule {
            self.harvest_cron.cancel();
            self.harvest_cron = self.stop.child_token();
            schedule_harvest(
                &self.tasks,
                file.harvest.schedule.clone(),
                self.harvest.clone(),
                self.harvest_cron.clone(),
            );
        }
        // What needs a restart kept the file's values; the running config
        // also holds what the daemon filled in at start (the addresses
        // bound, the node id), all of them restart settings.
        let running = self.live.get();
        let mut live = file.clone();
        live.api.listen = running.api.listen;
        live.gateway = running.gateway.clone();
        live.node = running.node.clone();
        self.file = file;
        if changes.applied.is_empty() {
            tracing::info!("config reloaded; nothing that applies at run time changed");
        } else {
            tracing::info!(changed = %changes.applied.join(", "), "config reloaded");
        }
        self.live.set(Arc::new(live));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml: &str) -> Config {
        Config::from_toml(toml, "t.toml").unwrap()
    }

    #[test]
    fn run_time_settings_apply_and_the_rest_is_named_and_kept() {
        let file = config(
            "[database]\npath = \"a.db\"\n[api]\nlisten = \"127.0.0.1:1\"\n\
             [[sources]]\nname = \"one\"\nurl = \"http://127.0.0.1:9/one.txt\"\n",
        );
        let new = config(
            "[database]\npath = \"b.db\"\n[api]\nlisten = \"127.0.0.1:2\"\n\
             token = \"0123456789abcdef0123\"\n\
             [check]\njudges = [\"http://user:secret@127.0.0.1:7/judge\"]\nconcurrency = 3\n\
             [harvest]\nschedule = \"0 0 * * * *\"\n\
             [[sources]]\nname = \"one\"\nurl = \"http://127.0.0.1:9/one.txt\"\n\
             [[sources]]\nname = \"two\"\nurl = \"http://127.0.0.1:9/two.txt\"\n",
        );
        let (merged, changes) = merge(&file, new.clone());
        assert_eq!(changes.restart, ["database", "api.listen"]);
        assert_eq!(merged.database, file.database);
        assert_eq!(merged.api.listen, file.api.listen);
        assert_eq!(merged.sources, new.sources);
        assert_eq!(merged.check, new.check);
        assert_eq!(merged.api.token, new.api.token);
        let applied = changes.applied.join(", ");
        assert_eq!(
            applied,
            "sources (added: two), harvest.schedule, \
             check.judges (http://127.0.0.1:7/judge), check, api.token"
        );
        assert!(!applied.contains("secret"));
        assert!(!applied.contains("0123456789"));

        let (_, same) = merge(&merged, merged.clone());
        assert_eq!(same, Changes::default());
    }
}
