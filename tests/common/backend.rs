//! The store test suite runs on both backends: [`on_both_backends!`]
//! turns each `async fn name(db: TestDb)` into a test on a fresh SQLite
//! file and one on a fresh PostgreSQL server.

use proxywarden::store::Store;

use super::postgres::PgServer;

/// A fresh store on one backend, with what keeps it alive.
pub struct TestDb {
    /// The store.
    pub store: Store,
    /// The folder holding the SQLite file, or the PostgreSQL server.
    _keep: Keep,
}

enum Keep {
    Dir(tempfile::TempDir),
    Server(PgServer),
}

impl TestDb {
    /// A store in a new SQLite file.
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.db")).unwrap();
        TestDb {
            store,
            _keep: Keep::Dir(dir),
        }
    }

    /// A store on a new PostgreSQL server of its own.
    pub async fn postgres() -> TestDb {
        let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
        let store = Store::connect(&server.url()).await.unwrap();
        TestDb {
            store,
            _keep: Keep::Server(server),
        }
    }

    /// The store as another node sees it: a second connection to the
    /// same PostgreSQL database; SQLite has one node, the same store.
    pub async fn second_node(&self) -> Store {
        match &self._keep {
            Keep::Server(server) => Store::connect(&server.url()).await.unwrap(),
            Keep::Dir(_) => self.store.clone(),
        }
    }

    /// Whether this is the PostgreSQL one.
    pub fn is_postgres(&self) -> bool {
        matches!(self._keep, Keep::Server(_))
    }
}

/// For each `name`, a module `name` with the tests `sqlite` and
/// `postgres`, each running `name(db)` on a fresh store of that backend.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test]
                async fn sqlite() {
                    super::$name(super::common::backend::TestDb::sqlite().await).await
                }

                #[tokio::test]
                async fn postgres() {
                    super::$name(super::common::backend::TestDb::postgres().await).await
                }
            }
        )*
    };
}
