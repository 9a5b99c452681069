//! A running session's inbox: messages from other sessions (the control channel, or the job's
//! spec) wait here until the agent's next turn boundary. They enter the session in `seq` order
//! with no gap, each once: a message after a missing one waits for it (the engine sends again
//! what a progress notice shows unread), and a `seq` already taken is dropped.

use shared::session::SessionMessage;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Default)]
pub struct Inbox(Arc<Mutex<Shelf>>);

#[derive(Debug, Default)]
struct Shelf {
    waiting: BTreeMap<u64, SessionMessage>,
    taken: u64,
}

impl Inbox {
    /// An inbox whose session has already taken every message up to `taken` (a resumed one).
    pub fn after(taken: u64) -> Self {
        let inbox = Inbox::default();
        inbox.lock().taken = taken;
        inbox
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shelf> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts messages on the shelf (those already taken are dropped).
    pub fn offer(&self, messages: impl IntoIterator<Item = SessionMessage>) {
        let mut shelf = self.lock();
        for m in messages {
            if m.seq > shelf.taken {
                shelf.waiting.insert(m.seq, m);
            }
        }
    }

    /// The messages that follow the last one taken without a gap, in order.
    pub fn take(&self) -> Vec<SessionMessage> {
        let mut shelf = self.lock();
        let mut out = Vec::new();
        loop {
            let next = shelf.taken + 1;
            match shelf.waiting.remove(&next) {
                Some(m) => {
                    shelf.taken = next;
                    out.push(m);
                }
                None => break,
            }
        }
        out
    }

    /// The highest `seq` the session has taken.
    pub fn taken(&self) -> u64 {
        self.lock().taken
    }
}

/// Messages as one user text (empty when there are none).
pub fn as_text(messages: &[SessionMessage]) -> String {
    messages
        .iter()
        .map(SessionMessage::as_user_text)
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::ids::NodeId;

    fn msg(seq: u64) -> SessionMessage {
        SessionMessage {
            seq,
            from: NodeId::new("tests"),
            invocation: 1,
            text: format!("m{seq}"),
        }
    }

    #[test]
    fn messages_are_taken_in_order_without_gaps_and_once() {
        let inbox = Inbox::default();
        inbox.offer([msg(2)]);
        assert!(inbox.take().is_empty(), "2 waits for 1");
        inbox.offer([msg(1), msg(2)]);
        assert_eq!(
            inbox.take().iter().map(|m| m.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        inbox.offer([msg(1), msg(2)]);
        assert!(inbox.take().is_empty(), "taken ones are not taken twice");
        assert_eq!(inbox.taken(), 2);
        let resumed = Inbox::after(2);
        resumed.offer([msg(2), msg(3)]);
        assert_eq!(resumed.take(), vec![msg(3)]);
        assert_eq!(as_text(&[msg(3)]), "[message from `tests`] m3");
    }
}
