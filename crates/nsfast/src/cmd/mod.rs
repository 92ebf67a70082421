//! One module per subcommand.

pub mod sockmap;
