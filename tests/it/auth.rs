//! Signed tokens on Join: refusals, room patterns, one avatar per user.
