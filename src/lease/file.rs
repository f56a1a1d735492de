//! The file store.
