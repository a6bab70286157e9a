//! The parity figures' arithmetic, free of any runtime.
//!
//! Workers measure in llama.cpp (crate `quantfarm-eval`); the coordinator, which links no C++, merges what they
//! measured into the report. What both sides must agree on lives here: the per-chunk KL-divergence statistics and
//! their exact merge ([`kld`]), the intervals and paired comparisons over per-token values ([`paired`]), and the
//! rule that stops measuring a rung once its verdict is known ([`sequential`]).

#![forbid(unsafe_code)]

pub mod kld;
pub mod paired;
pub mod sequential;
pub mod splitmix;

pub use kld::{ChunkStats, Estimate, KldSummary, PositionScore, StatsError};
pub use paired::{mean_interval, paired_kld, MeanInterval};
