//! One module per subcommand.

pub mod pod;
pub mod sockmap;
pub mod vsock;
