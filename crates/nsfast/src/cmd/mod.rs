//! One module per subcommand.

pub mod sockmap;
pub mod vsock;
