//! A PostgreSQL server of the test's own: a fresh cluster in a temp dir
//! (`initdb`, then `postgres` on a free port of 127.0.0.1), stopped and
//! removed when dropped. As root (as CI runs) both run as the `postgres`
//! user, which PostgreSQL requires. The binaries are taken from
//! `SVC_PG_BIN`, else from the newest `/usr/lib/postgresql/*/bin`, else
//! from the `PATH`; without them the test fails and says how to install them.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct TempPostgres {
    child: Child,
    data: PathBuf,
    pub port: u16,
    bin: PathBuf,
    user: Option<(u32, u32)>,
    dir: tempfile::TempDir,
}

/// The directory with `initdb` and `postgres`.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SVC_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("postgres").exists())
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    let found = Command::new("sh").args(["-c", "command -v initdb"]).output().expect("sh runs");
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    assert!(
        !path.is_empty(),
        "no PostgreSQL server found: install Debian's `postgresql` package (as .ci/run does), \
         or set SVC_PG_BIN to the directory holding initdb and postgres"
    );
    Path::new(&path).parent().expect("a directory").to_path_buf()
}

/// The `postgres` user's uid and gid when running as root.
fn postgres_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid takes no arguments and cannot fail.
    #[allow(unsafe_code)]
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let output = Command::new("id").args([flag, "postgres"]).output().expect("id runs");
        assert!(output.status.success(), "running as root needs a `postgres` user (Debian's package makes one)");
        String::from_utf8_lossy(&output.stdout).trim().parse().expect("a numeric id")
    };
    Some((id("-u"), id("-g")))
}

fn as_postgres(command: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn(bin: &Path, user: Option<(u32, u32)>, data: &Path, port: u16, sockets: &Path) -> Child {
    as_postgres(&mut Command::new(bin.join("postgres")), user)
        .arg("-D")
        .arg(data)
        .args(["-p", &port.to_string(), "-k"])
        .arg(sockets)
        .args(["-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "fsync=on"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("postgres starts")
}

impl TempPostgres {
    pub fn start() -> TempPostgres {
        let bin = bin_dir();
        let user = postgres_user();
        let dir = tempfile::tempdir().unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let data = dir.path().join("data");
        let initdb = as_postgres(&mut Command::new(bin.join("initdb")), user)
            .args(["--auth=trust", "--username=postgres", "--encoding=UTF8", "--no-instructions", "-D"])
            .arg(&data)
            .output()
            .expect("initdb runs");
        assert!(initdb.status.success(), "initdb failed: {}", String::from_utf8_lossy(&initdb.stderr));
        let port = free_port();
        let child = spawn(&bin, user, &data, port, dir.path());
        let server = TempPostgres { child, data, port, bin, user, dir };
        server.wait_ready();
        server
    }

    /// Stops the server at once (open sessions end, as in a crash of the
    /// database's host: nothing committed is lost) and starts it again on
    /// the same port and data; answers once it takes connections.
    pub fn restart(&mut self) {
        self.stop();
        self.child = spawn(&self.bin, self.user, &self.data, self.port, self.dir.path());
        self.wait_ready();
    }

    /// Immediate shutdown (SIGQUIT): no checkpoint, sessions cut; the next
    /// start recovers from the WAL.
    fn stop(&mut self) {
        // SAFETY: signals the child this value owns.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGQUIT);
        }
        let _ = self.child.wait();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && self.data.join("postmaster.pid").exists()
                && self.psql("postgres", "SELECT 1").is_ok()
            {
                return;
            }
            assert!(Instant::now() < deadline, "postgres did not start on port {}", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs one statement through a fresh connection (blocking).
    pub fn psql(&self, database: &str, statement: &str) -> Result<(), String> {
        let url = self.url(database);
        let statement = statement.to_string();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let (client, connection) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await.map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                client.batch_execute(&statement).await.map_err(|error| match error.as_db_error() {
                    Some(db) => format!("{}: {}", db.code().code(), db.message()),
                    None => error.to_string(),
                })
            })
        })
        .join()
        .unwrap()
    }

    /// The URL of a database on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Makes a new, empty database and answers its URL.
    pub fn database(&self, name: &str) -> String {
        self.psql("postgres", &format!("CREATE DATABASE {name}")).expect("the database is made");
        self.url(name)
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        // SIGINT is PostgreSQL's fast shutdown: open sessions end at once.
        // SAFETY: signals the child this value owns.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
