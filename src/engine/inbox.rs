//! The engine's inbox: commands from any number of handles to the one engine
//! thread, bounded.
//!
//! Bounded by count and by the bytes the queued commands carry, so that a
//! flood of large requests waits in the clients, not in the server's memory.
//!
//! A queue under a mutex that the engine empties a batch at a time, and a
//! condvar it sleeps on. Unlike a general-purpose channel, the engine does
//! not spin or yield before it sleeps: on a machine with few cores a yield is
//! a context switch taken from the very threads that are about to submit,
//! and a sender wakes the engine only when it is actually asleep.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::image::StateImage;
use super::requests::{Queued, Reply};

/// What waits in the engine's inbox: a request, or one of the controls the
/// batch loop itself handles around the turn's commit.
pub(crate) enum Command {
    Request(Box<dyn Queued>),
    Shutdown { snapshot: bool, reply: Reply<()> },
    Image { reply: Reply<StateImage> },
    Snapshot { reply: Reply<()> },
}

impl Command {
    /// About how many bytes this command carries, for the inbox's bound.
    pub(crate) fn held_bytes(&self) -> u64 {
        match self {
            Command::Request(request) => request.held_bytes(),
            _ => std::mem::size_of::<Command>() as u64,
        }
    }
}

/// Why a command was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SendError {
    /// The inbox holds its capacity already.
    Full,
    /// The engine has stopped.
    Stopped,
}

/// What a wait for commands ended with.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// At least one command was taken.
    Commands,
    /// The wait ran out with nothing queued.
    Timeout,
    /// Nothing is queued and every sender is gone.
    Disconnected,
}

struct Queue {
    /// Each command with its [`Command::held_bytes`].
    commands: VecDeque<(Command, u64)>,
    /// The sum of the queued commands' bytes.
    bytes: u64,
    /// The engine sleeps and must be woken by the next command.
    sleeping: bool,
    senders: usize,
    receiver_alive: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    capacity: usize,
    bytes_capacity: u64,
}

/// A new inbox holding at most `capacity` commands and `bytes_capacity`
/// bytes of them (one command is always taken into an empty inbox).
pub(crate) fn inbox(capacity: usize, bytes_capacity: u64) -> (InboxSender, InboxReceiver) {
    let queue = Queue { commands: VecDeque::new(), bytes: 0, sleeping: false, senders: 1, receiver_alive: true };
    let shared = Arc::new(Shared { queue: Mutex::new(queue), wake: Condvar::new(), capacity, bytes_capacity });
    (InboxSender { shared: shared.clone() }, InboxReceiver { shared })
}

/// The submitting side; clones share the inbox.
pub(crate) struct InboxSender {
    shared: Arc<Shared>,
}

impl InboxSender {
    pub fn send(&self, command: Command) -> Result<(), SendError> {
        let bytes = command.held_bytes();
        let mut queue = self.shared.queue.lock();
        if !queue.receiver_alive {
            return Err(SendError::Stopped);
        }
        let over_bytes = !queue.commands.is_empty() && queue.bytes + bytes > self.shared.bytes_capacity;
        if queue.commands.len() >= self.shared.capacity || over_bytes {
            return Err(SendError::Full);
        }
        queue.bytes += bytes;
        queue.commands.push_back((command, bytes));
        let wake = std::mem::replace(&mut queue.sleeping, false);
        drop(queue);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }
}

impl Clone for InboxSender {
    fn clone(&self) -> Self {
        self.shared.queue.lock().senders += 1;
        InboxSender { shared: self.shared.clone() }
    }
}

impl Drop for InboxSender {
    fn drop(&mut self) {
        let mut queue = self.shared.queue.lock();
        queue.senders -= 1;
        let last = queue.senders == 0;
        drop(queue);
        if last {
            self.shared.wake.notify_one();
        }
    }
}

/// The engine's side.
pub(crate) struct InboxReceiver {
    shared: Arc<Shared>,
}

impl InboxReceiver {
    /// Moves up to `max` queued commands, holding at most `max_bytes` (but
    /// always the first), into `batch`, first waiting up to `timeout` for one
    /// when none is queued.
    pub fn receive(&self, batch: &mut Vec<Command>, max: usize, max_bytes: u64, timeout: Duration) -> Received {
        let deadline = Instant::now() + timeout;
        let mut queue = self.shared.queue.lock();
        while queue.commands.is_empty() {
            if queue.senders == 0 {
                return Received::Disconnected;
            }
            queue.sleeping = true;
            if self.shared.wake.wait_until(&mut queue, deadline).timed_out() && queue.commands.is_empty() {
                queue.sleeping = false;
                return Received::Timeout;
            }
        }
        queue.sleeping = false;
        let mut count = 0;
        let mut taken = 0;
        for (_, bytes) in queue.commands.iter().take(max) {
            if count > 0 && taken + bytes > max_bytes {
                break;
            }
            count += 1;
            taken += bytes;
        }
        batch.extend(queue.commands.drain(..count).map(|(command, _)| command));
        queue.bytes -= taken;
        Received::Commands
    }
}

impl Drop for InboxReceiver {
    fn drop(&mut self) {
        let mut queue = self.shared.queue.lock();
        queue.receiver_alive = false;
        // Dropped outside the lock: each holds a reply whose requester learns
        // that the engine stopped.
        let left = std::mem::take(&mut queue.commands);
        drop(queue);
        drop(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn probe() -> (Command, oneshot::Receiver<Result<(), super::super::api::EngineError>>) {
        let (reply, answer) = oneshot::channel();
        let request = super::super::requests::Envelope { request: super::super::requests::Probe, reply };
        (Command::Request(Box::new(request)), answer)
    }

    #[test]
    fn commands_come_out_in_order_up_to_the_batch_size() {
        let (sender, receiver) = inbox(8, u64::MAX);
        let mut answers = Vec::new();
        for _ in 0..5 {
            let (command, answer) = probe();
            sender.send(command).unwrap();
            answers.push(answer);
        }
        let mut batch = Vec::new();
        assert_eq!(receiver.receive(&mut batch, 3, u64::MAX, Duration::ZERO), Received::Commands);
        assert_eq!(batch.len(), 3);
        assert_eq!(receiver.receive(&mut batch, 3, u64::MAX, Duration::ZERO), Received::Commands);
        assert_eq!(batch.len(), 5);
    }

    #[test]
    fn a_full_inbox_refuses_and_a_stopped_engine_is_reported() {
        let (sender, receiver) = inbox(1, u64::MAX);
        sender.send(probe().0).unwrap();
        assert_eq!(sender.send(probe().0), Err(SendError::Full));
        let (command, answer) = probe();
        drop(receiver);
        assert_eq!(sender.send(command), Err(SendError::Stopped));
        drop(answer);
    }

    fn ack_with_result(bytes: usize) -> Command {
        let (reply, _) = oneshot::channel();
        let result = Some("1".repeat(bytes));
        let ack = super::super::jobs::Ack { id: crate::job::JobId(0), result, worker_id: None };
        Command::Request(Box::new(super::super::requests::Envelope { request: ack, reply }))
    }

    #[test]
    fn a_batch_takes_commands_up_to_its_bytes_but_always_one() {
        let (sender, receiver) = inbox(100, u64::MAX);
        for bytes in [50_000, 4_000, 4_000, 4_000] {
            sender.send(ack_with_result(bytes)).unwrap();
        }
        let mut batch = Vec::new();
        receiver.receive(&mut batch, 8, 10_000, Duration::ZERO);
        assert_eq!(batch.len(), 1, "a command over the bound comes alone");
        batch.clear();
        receiver.receive(&mut batch, 8, 10_000, Duration::ZERO);
        assert_eq!(batch.len(), 2, "two of 4 000 bytes and their envelopes fit, three do not");
        batch.clear();
        receiver.receive(&mut batch, 8, 10_000, Duration::ZERO);
        assert_eq!(batch.len(), 1);
    }

    #[test]
    fn the_inbox_is_bounded_by_bytes_too_but_always_takes_one_command() {
        let (sender, receiver) = inbox(100, 10_000);
        sender.send(ack_with_result(50_000)).expect("an empty inbox takes any one command");
        assert_eq!(sender.send(ack_with_result(10)), Err(SendError::Full));
        let mut batch = Vec::new();
        assert_eq!(receiver.receive(&mut batch, 8, u64::MAX, Duration::ZERO), Received::Commands);
        sender.send(ack_with_result(4_000)).unwrap();
        sender.send(ack_with_result(4_000)).unwrap();
        assert_eq!(sender.send(ack_with_result(4_000)), Err(SendError::Full), "past 10 000 bytes");
        sender.send(probe().0).expect("small commands still fit");
    }

    #[test]
    fn queued_commands_are_dropped_with_the_receiver_so_requesters_hear_of_it() {
        let (sender, receiver) = inbox(4, u64::MAX);
        let (command, answer) = probe();
        sender.send(command).unwrap();
        drop(receiver);
        assert!(answer.blocking_recv().is_err(), "the reply was dropped, not left hanging");
    }

    #[test]
    fn an_empty_wait_times_out_and_the_last_sender_gone_disconnects() {
        let (sender, receiver) = inbox(4, u64::MAX);
        let mut batch = Vec::new();
        assert_eq!(receiver.receive(&mut batch, 8, u64::MAX, Duration::from_millis(1)), Received::Timeout);
        let second = sender.clone();
        drop(sender);
        assert_eq!(receiver.receive(&mut batch, 8, u64::MAX, Duration::ZERO), Received::Timeout);
        drop(second);
        assert_eq!(receiver.receive(&mut batch, 8, u64::MAX, Duration::from_secs(60)), Received::Disconnected);
    }

    #[test]
    fn a_sleeping_engine_is_woken_by_a_command_from_another_thread() {
        let (sender, receiver) = inbox(4, u64::MAX);
        let submitter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            sender.send(probe().0).unwrap();
            sender
        });
        let mut batch = Vec::new();
        assert_eq!(receiver.receive(&mut batch, 8, u64::MAX, Duration::from_secs(60)), Received::Commands);
        assert_eq!(batch.len(), 1);
        drop(submitter.join().unwrap());
    }
}
