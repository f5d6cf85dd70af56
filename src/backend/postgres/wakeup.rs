//! Waking long-poll fetches (docs/postgres.md, "Wake-ups"): a transaction
//! that makes jobs available sends `NOTIFY svc_jobs, '<queue>'`, delivered
//! to every node when it commits (and once per queue per transaction, as
//! PostgreSQL folds repeated notifications). Each node keeps one connection
//! listening, outside the pool, and wakes the fetches waiting on that
//! queue. While the listening connection is down (or on a database without
//! `NOTIFY`), waiting fetches look again every [`POLL_INTERVAL`] instead;
//! the connection is made again in the background.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// The channel svc notifies and listens on.
pub const CHANNEL: &str = "svc_jobs";
/// How often a waiting fetch looks again while no notification can come.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How often a waiting fetch looks again even while notifications come: a
/// safety net for a notification lost with a connection.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(2);
/// The wait before making a lost listening connection again.
const RECONNECT_WAIT: Duration = Duration::from_secs(1);

/// One node's listener: who waits on which queue.
#[derive(Default)]
pub struct Wakeups {
    /// Each waiting fetch's signal, under every queue it waits on.
    queues: Mutex<HashMap<String, Vec<Arc<Notify>>>>,
    listening: AtomicBool,
}

/// A fetch waiting for jobs on some queues; stops being woken when dropped.
pub struct Waiter {
    wakeups: Arc<Wakeups>,
    queues: Vec<String>,
    signal: Arc<Notify>,
}

impl Waiter {
    /// Returns once woken (a wake-up that came since the last wait counts),
    /// or after `most`, or after the listener's recheck interval.
    pub async fn wait(&self, most: Duration) {
        let sleep = most.min(self.wakeups.recheck_after());
        let _ = tokio::time::timeout(sleep, self.signal.notified()).await;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut queues = self.wakeups.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for queue in &self.queues {
            if let Some(signals) = queues.get_mut(queue) {
                signals.retain(|signal| !Arc::ptr_eq(signal, &self.signal));
                if signals.is_empty() {
                    queues.remove(queue);
                }
            }
        }
    }
}

impl Wakeups {
    /// Starts listening with a connection of its own, made again whenever
    /// it is lost, until the returned task is aborted.
    pub fn listen(self: &Arc<Self>, config: tokio_postgres::Config) -> tokio::task::JoinHandle<()> {
        let wakeups = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(error) = wakeups.listen_once(&config).await {
                    tracing::warn!(%error, "the listening connection failed; fetches poll until it is back");
                }
                wakeups.listening.store(false, Ordering::SeqCst);
                // Whoever waits looks again now, then polls.
                wakeups.wake_all();
                tokio::time::sleep(RECONNECT_WAIT).await;
            }
        })
    }

    async fn listen_once(&self, config: &tokio_postgres::Config) -> Result<(), tokio_postgres::Error> {
        let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
        // The connection is driven here, its notifications read as they come;
        // the `LISTEN` below goes out through it.
        let listen = async {
            client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
            self.listening.store(true, Ordering::SeqCst);
            // Notifications sent before `LISTEN` took effect are lost: look again.
            self.wake_all();
            std::future::pending::<Result<(), tokio_postgres::Error>>().await
        };
        let drive = async {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(notification))) => {
                        self.wake(notification.payload())
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => return Err(error),
                    None => return Ok(()),
                }
            }
        };
        tokio::select! {
            result = listen => result,
            result = drive => result,
        }
    }

    /// Whether notifications arrive now.
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::SeqCst)
    }

    /// Registers a fetch waiting on `queues`. Register before looking for
    /// jobs: a wake-up between the look and the wait is kept, not lost.
    pub fn waiter(self: &Arc<Self>, queues: &[String]) -> Waiter {
        let signal = Arc::new(Notify::new());
        let mut registered = self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for queue in queues {
            registered.entry(queue.clone()).or_default().push(signal.clone());
        }
        Waiter { wakeups: self.clone(), queues: queues.to_vec(), signal }
    }

    /// Wakes the fetches waiting on `queue`.
    pub fn wake(&self, queue: &str) {
        let queues = self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for signal in queues.get(queue).into_iter().flatten() {
            signal.notify_one();
        }
    }

    fn wake_all(&self) {
        let queues = self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for signal in queues.values().flatten() {
            signal.notify_one();
        }
    }

    /// How long a waiting fetch sleeps before it looks again by itself.
    pub fn recheck_after(&self) -> Duration {
        if self.listening() { RECHECK_INTERVAL } else { POLL_INTERVAL }
    }
}
