//! One module per subcommand.

pub mod bench;
pub mod examples;
pub mod gendocs;
pub mod manref;
pub mod metrics;
pub mod output;
pub mod pod;
pub mod policy;
pub mod probe;
pub mod sockmap;
pub mod vsock;
