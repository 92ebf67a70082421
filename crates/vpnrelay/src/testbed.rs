//! Test world (placeholder, filled below).
