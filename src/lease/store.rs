//! The operations the rule needs from a coordination store.
