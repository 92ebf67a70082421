//! The pod datapath's types and names, mirrored once in [`nsfast_bpf::pod_abi`].

pub use nsfast_bpf::pod_abi::*;
