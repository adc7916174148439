//! Shutdown: SIGTERM or Ctrl-C flips one watch channel that every server
//! and the lease keeper listen to.

use tokio::sync::watch;

/// The sending side: flipped once.
#[derive(Debug)]
pub struct Shutdown {
    tx: watch::Sender<bool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// Not yet shutting down.
    pub fn new() -> Self {
        Shutdown {
            tx: watch::channel(false).0,
        }
    }
    /// A receiver for a task.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }
    /// Starts the shutdown.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }
}

/// Resolves when `rx` turns true (or its sender is gone).
pub async fn wait(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Resolves on SIGTERM or SIGINT.
pub async fn signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
