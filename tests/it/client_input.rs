//! What a connected client may send: ping budget, fragments, text frames, per-address joins.
