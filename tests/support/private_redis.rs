//! A Redis server of a test's own (a free port, a folder of its own), for tests that kill and
//! wipe it without disturbing the shared one. Started like production: append-only file,
//! fsynced on every write.

use anyhow::{bail, Context};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PrivateRedis {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PrivateRedis {
    pub fn start() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut r = PrivateRedis {
            port,
            dir: tempfile::tempdir()?,
            child: None,
        };
        r.spawn()?;
        Ok(r)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        std::fs::create_dir_all(self.data_dir())?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(self.data_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start redis-server (run scripts/provision.sh)")?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("redis-server on port {} did not come up", self.port)
    }

    /// Kills the server without saving (`SHUTDOWN NOSAVE`), deletes its data (append-only
    /// file included) and starts it again empty: everything it held is lost.
    pub async fn lose_everything(&mut self) -> anyhow::Result<()> {
        self.shutdown_nosave().await?;
        std::fs::remove_dir_all(self.data_dir())?;
        self.spawn()
    }

    /// A copy of the server's data as it is now (its append-only files), to start it from
    /// again later with `restart_from`.
    pub fn copy_data(&self) -> anyhow::Result<tempfile::TempDir> {
        let copy = tempfile::tempdir()?;
        copy_tree(&self.data_dir(), copy.path())?;
        Ok(copy)
    }

    /// Stops the server without saving and starts it again from `copy`: a server restored
    /// from an older backup, with everything written since lost (its epoch is the copy's).
    pub async fn restart_from(&mut self, copy: &tempfile::TempDir) -> anyhow::Result<()> {
        self.shutdown_nosave().await?;
        std::fs::remove_dir_all(self.data_dir())?;
        copy_tree(copy.path(), &self.data_dir())?;
        self.spawn()
    }

    /// Stops the server as `redis-cli shutdown` does: its append-only file is kept, so
    /// `start_again` brings back everything it held.
    pub async fn shutdown(&mut self) -> anyhow::Result<()> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let _: Result<(), _> = redis::cmd("SHUTDOWN").query_async(&mut conn).await;
        if let Some(mut c) = self.child.take() {
            c.wait()?;
        }
        Ok(())
    }

    /// Starts the stopped server again on its port and data, and waits until it answers a
    /// `PING` (its data loaded): the moment a recovery is measured from.
    pub async fn start_again(&mut self) -> anyhow::Result<Instant> {
        self.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let client = redis::Client::open(self.url())?;
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let pong: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut conn).await;
                if pong.is_ok() {
                    return Ok(Instant::now());
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "redis did not answer after its restart"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shutdown_nosave(&mut self) -> anyhow::Result<()> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        // The server closes the connection instead of answering.
        let _: Result<(), _> = redis::cmd("SHUTDOWN")
            .arg("NOSAVE")
            .query_async(&mut conn)
            .await;
        if let Some(mut c) = self.child.take() {
            c.wait()?;
        }
        Ok(())
    }

    /// Number of keys the server holds.
    pub async fn key_count(&self) -> anyhow::Result<u64> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        Ok(redis::cmd("DBSIZE").query_async(&mut conn).await?)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Copies the files under `from` into `to` (created), folders included.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}
