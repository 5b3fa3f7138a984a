//! advmd
