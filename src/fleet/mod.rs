pub mod artifact;
