//! One module per subcommand.

pub mod bench;
pub mod gendocs;
pub mod output;
pub mod pod;
pub mod probe;
pub mod sockmap;
pub mod vsock;
