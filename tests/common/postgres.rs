//! A real PostgreSQL server for a test: Debian's `postgresql` binaries,
//! a cluster in a temporary folder (copied from one `initdb` made once per
//! machine), a free port on 127.0.0.1 and its socket in the folder. As
//! root, the server runs as the `postgres` user. Dropping the handle stops
//! the server and removes the folder. Missing binaries fail the test with
//! what to install; nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Where Debian installs the server's programs, newest first.
const BIN_DIRS: &str = "/usr/lib/postgresql";

/// One running server.
pub struct PgServer {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    /// The server's options (port, socket folder, settings), for a start
    /// after a stop.
    options: String,
    /// Holds the cluster and the socket; removed after the server stops.
    _dir: tempfile::TempDir,
}

/// The newest `/usr/lib/postgresql/<version>/bin` holding the programs.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(BIN_DIRS)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "the PostgreSQL tests need a PostgreSQL server: install the `postgresql` package \
             (apt-get install postgresql); no initdb/pg_ctl found under {BIN_DIRS}/*/bin"
        ),
    }
}

/// Whether this process runs as root (the owner of its `/proc` entry).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `program` run as the user the server runs as.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Makes `path` the server user's.
fn hand_over(path: &Path) {
    if is_root() {
        run(Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path));
    }
}

fn run(cmd: &mut Command) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A cluster made by `initdb` once per machine and server version, kept in
/// the temporary directory and copied for each server: `initdb` takes
/// seconds, a copy a fraction of that.
fn template(bin: &Path) -> PathBuf {
    static MADE: Mutex<()> = Mutex::new(());
    let _one_at_a_time = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let version = bin
        .parent()
        .and_then(|v| v.file_name())
        .and_then(|v| v.to_str())
        .unwrap_or("pg");
    let user = if is_root() { "root" } else { "user" };
    let path = std::env::temp_dir().join(format!("proxywarden-pg-template-{version}-{user}"));
    if path.join("PG_VERSION").exists() {
        return path;
    }
    let staging = tempfile::Builder::new()
        .prefix("proxywarden-pg-initdb-")
        .tempdir()
        .unwrap();
    hand_over(staging.path());
    let data = staging.path().join("data");
    run(as_server_user(&bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
        .args(["--locale=C"]));
    // Another test binary may have made it meanwhile: either copy will do.
    if std::fs::rename(&data, &path).is_err() {
        assert!(path.join("PG_VERSION").exists(), "cannot keep {path:?}");
    }
    path
}

impl PgServer {
    /// Starts a server of its own and waits until it takes connections.
    pub fn start() -> PgServer {
        let bin = bin_dir();
        let template = template(&bin);
        let dir = tempfile::Builder::new()
            .prefix("proxywarden-pg-")
            .tempdir()
            .unwrap();
        let data = dir.path().join("data");
        run(Command::new("cp").arg("-a").arg(&template).arg(&data));
        hand_over(dir.path());
        // A port free now; the server binds it a moment later, and
        // another process may take it meanwhile: then another port.
        let mut tries = 0;
        let port = loop {
            tries += 1;
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let options = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
                 -c synchronous_commit=off -c full_page_writes=off",
                dir.path().display()
            );
            // -w waits until the server accepts connections (or fails).
            let mut start = as_server_user(&bin.join("pg_ctl"));
            start
                .arg("-D")
                .arg(&data)
                .args(["-w", "-t", "60", "-o", &options, "-l"])
                .arg(dir.path().join("server.log"))
                .arg("start");
            if tries == 3 {
                run(&mut start);
                break (port, options);
            }
            let started = start
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if started {
                break (port, options);
            }
        };
        let (port, options) = port;
        PgServer {
            bin,
            data,
            port,
            options,
            _dir: dir,
        }
    }

    /// `pg_ctl <action>` on this server's cluster, waiting until it is
    /// done; the server's output goes to its log file.
    fn pg_ctl(&self, action: &str) {
        let log = self.data.parent().unwrap().join("server.log");
        run(as_server_user(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "60", "-m", "fast", "-o", &self.options, "-l"])
            .arg(log)
            .arg(action));
    }

    /// Stops the server (fast: sessions are ended, what is committed is
    /// kept); [`PgServer::start_again`] starts it on the same port.
    pub fn stop(&self) {
        self.pg_ctl("stop");
    }

    /// Starts the server [`PgServer::stop`] stopped, on the same port.
    pub fn start_again(&self) {
        self.pg_ctl("start");
    }

    /// `pg_ctl restart`: every session is ended, the server comes back on
    /// the same port.
    pub fn restart(&self) {
        self.pg_ctl("restart");
    }

    /// The URL of database `db` on this server, logging in as `user`.
    pub fn url_as(&self, user: &str, db: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{db}", self.port)
    }

    /// The URL of database `postgres` on this server.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A store on a new, empty database `name` of this server (a test
    /// running many cases gives each its own).
    pub async fn fresh_store(&self, name: &str) -> proxywarden::store::Store {
        let (client, connection) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        drop(client);
        let _ = driver.await;
        proxywarden::store::Store::connect(&self.url_as("postgres", name))
            .await
            .unwrap()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = as_server_user(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
