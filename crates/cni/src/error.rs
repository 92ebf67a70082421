//! The CNI error object and the spec's error codes: a leaf module that `spec`, `log` and the
//! rest of the crate import (re-exported as `spec::{code, CniError}`).

/// Well-known CNI error codes.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// Plugin-specific: the container already has this interface.
    pub const ALREADY_EXISTS: u32 = 100;
    /// Plugin-specific: CHECK found the attachment damaged.
    pub const CHECK_FAILED: u32 = 101;
}

/// A CNI error, printed as the spec's error object.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{msg}")]
pub struct CniError {
    pub cni_version: String,
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self {
            cni_version: "1.1.0".into(),
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The process exit status for this error (docs/json.md, "Exit codes"): 2 when the
    /// runtime's input is at fault (version, field, environment, decoding, configuration),
    /// 1 for a failure. The spec asks only for non-zero; the error object on stdout is the
    /// answer a runtime reads.
    pub fn exit_status(&self) -> u8 {
        match self.code {
            code::INCOMPATIBLE_VERSION
            | code::UNSUPPORTED_FIELD
            | code::INVALID_ENV
            | code::DECODE_FAILURE
            | code::INVALID_CONFIG => nsfast_sys::report::EXIT_USAGE,
            _ => nsfast_sys::report::EXIT_FAILURE,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::json!({
            "cniVersion": self.cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
        .to_string()
    }
}
