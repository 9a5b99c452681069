//! The images this worker holds: those it has started a container of (on a fleet each host has
//! its own engine, and an image a worker ran is in it, with its layers in the page cache and its
//! kind in the warm pool). Each is announced once to the one listener (the consumer, which then
//! takes that image's jobs first); images held before it listens are announced when it does.

use super::execution::unpoisoned;
use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};
use tokio::sync::mpsc;

#[derive(Default)]
pub(super) struct Holdings {
    held: Mutex<BTreeSet<String>>,
    listener: OnceLock<mpsc::UnboundedSender<String>>,
}

impl Holdings {
    /// The announcements of images held, for the first caller; none for a later one.
    pub(super) fn listen(&self) -> Option<mpsc::UnboundedReceiver<String>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let held = unpoisoned(&self.held);
        self.listener.set(tx.clone()).ok()?;
        for image in held.iter() {
            let _ = tx.send(image.clone());
        }
        Some(rx)
    }

    /// Notes that a container of `image` started here; announces it the first time.
    pub(super) fn hold(&self, image: &str) {
        let mut held = unpoisoned(&self.held);
        if held.insert(image.to_string()) {
            if let Some(tx) = self.listener.get() {
                let _ = tx.send(image.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_image_is_announced_once_to_the_one_listener_even_if_held_before_it_listened() {
        let h = Holdings::default();
        h.hold("a:1");
        let mut rx = h.listen().expect("the first listener");
        assert!(h.listen().is_none(), "one listener only");
        h.hold("b:1");
        h.hold("a:1");
        h.hold("b:1");
        let mut got = Vec::new();
        while let Ok(image) = rx.try_recv() {
            got.push(image);
        }
        assert_eq!(got, ["a:1", "b:1"]);
    }
}
