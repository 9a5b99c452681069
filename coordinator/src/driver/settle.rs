//! Settling a message that holds several parts (a worker's batch of results): each part is
//! applied on its own, with its run's other events, and the message is settled once every part
//! is. It is acked when each part was committed or dropped, and requeued when any part could
//! not be applied yet (its committed parts come back as duplicates, which change nothing).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use worker::queue::Incoming;

/// How one part of a message is settled: the whole message, or its share of one.
pub(super) enum Settle {
    Whole(Incoming),
    Part(Arc<Shared>),
}

/// A message split into parts, and how many of them are not settled yet.
pub(super) struct Shared {
    message: Mutex<Option<Incoming>>,
    left: AtomicUsize,
    requeue: AtomicBool,
}

impl Settle {
    /// One settle per part of `message` (`parts` of them, at least one).
    pub fn split(message: Incoming, parts: usize) -> Vec<Settle> {
        if parts <= 1 {
            return vec![Settle::Whole(message)];
        }
        let shared = Arc::new(Shared {
            message: Mutex::new(Some(message)),
            left: AtomicUsize::new(parts),
            requeue: AtomicBool::new(false),
        });
        (0..parts).map(|_| Settle::Part(shared.clone())).collect()
    }

    /// The part is committed.
    pub async fn ack(self) {
        match self {
            Settle::Whole(m) => {
                let _ = m.ack().await;
            }
            Settle::Part(shared) => shared.done(false).await,
        }
    }

    /// The part could not be applied now: the message comes back later.
    pub async fn requeue(self) {
        match self {
            Settle::Whole(m) => {
                let _ = m.requeue().await;
            }
            Settle::Part(shared) => shared.done(true).await,
        }
    }

    /// The part is dropped (poison, or for a run that does not exist); the caller logged why.
    pub async fn reject(self) {
        match self {
            Settle::Whole(m) => {
                let _ = m.reject().await;
            }
            Settle::Part(shared) => shared.done(false).await,
        }
    }
}

impl Shared {
    async fn done(&self, requeue: bool) {
        if requeue {
            self.requeue.store(true, Ordering::SeqCst);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let message = self.message.lock().expect("message").take();
        if let Some(m) = message {
            let _ = match self.requeue.load(Ordering::SeqCst) {
                true => m.requeue().await,
                false => m.ack().await,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use shared::ports::PortError;
    use worker::queue::Acker;

    struct Recorded(Arc<Mutex<Vec<&'static str>>>);

    #[async_trait]
    impl Acker for Recorded {
        async fn ack(self: Box<Self>) -> Result<(), PortError> {
            self.0.lock().unwrap().push("ack");
            Ok(())
        }
        async fn requeue(self: Box<Self>, _: Vec<u8>, _: u32) -> Result<(), PortError> {
            self.0.lock().unwrap().push("requeue");
            Ok(())
        }
        async fn reject(self: Box<Self>, _: Vec<u8>, _: u32) -> Result<(), PortError> {
            self.0.lock().unwrap().push("reject");
            Ok(())
        }
    }

    fn message() -> (Incoming, Arc<Mutex<Vec<&'static str>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let m = Incoming {
            body: b"batch".to_vec(),
            delivery_count: 0,
            acker: Box::new(Recorded(log.clone())),
        };
        (m, log)
    }

    #[tokio::test]
    async fn a_message_of_parts_is_acked_once_every_part_is_settled() {
        let (m, log) = message();
        let mut parts = Settle::split(m, 3).into_iter();
        parts.next().unwrap().ack().await;
        parts.next().unwrap().reject().await;
        assert!(log.lock().unwrap().is_empty(), "a part is still open");
        parts.next().unwrap().ack().await;
        assert_eq!(*log.lock().unwrap(), ["ack"]);
    }

    #[tokio::test]
    async fn a_part_that_must_come_back_requeues_the_whole_message_once_all_are_settled() {
        let (m, log) = message();
        let mut parts = Settle::split(m, 3).into_iter();
        parts.next().unwrap().requeue().await;
        parts.next().unwrap().ack().await;
        assert!(log.lock().unwrap().is_empty(), "a part is still open");
        parts.next().unwrap().ack().await;
        assert_eq!(*log.lock().unwrap(), ["requeue"]);
    }

    #[tokio::test]
    async fn a_message_of_one_part_is_settled_as_it_is() {
        for (how, want) in [(0, "ack"), (1, "requeue"), (2, "reject")] {
            let (m, log) = message();
            let part = Settle::split(m, 1).pop().unwrap();
            match how {
                0 => part.ack().await,
                1 => part.requeue().await,
                _ => part.reject().await,
            }
            assert_eq!(*log.lock().unwrap(), [want]);
        }
    }
}
