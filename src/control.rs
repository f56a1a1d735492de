//! The control part: the control socket and its clients (`socket.rs`), and the answers
//! owed to parked clients with the stops and restarts held for their dependents
//! (`parked.rs`).

mod parked;
mod socket;
pub use parked::{Control, QueuedState, WaitFor, Waiter};
pub use socket::*;
