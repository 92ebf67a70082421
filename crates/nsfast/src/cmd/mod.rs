//! One module per subcommand.

pub mod bench;
pub mod gendocs;
pub mod pod;
pub mod probe;
pub mod sockmap;
pub mod vsock;
