//! Member data: the small key/value pairs an app hangs on a member (a
//! colour, a status, a link to its own user).
//!
//! A member's [`Data`] is kept sorted by key, so it has one encoding. Keys
//! are 1 to [`MAX_KEY_CHARS`] characters of `[a-z0-9_.-]`; values follow
//! the text rule of names and chat ([`text`](super::text)) up to
//! `Rules::max_data_value_chars`; a member holds at most
//! `Rules::max_data_entries` entries of `Rules::max_data_bytes` bytes of
//! keys and values together. Pure: the Join's entries, a `SetData`'s
//! changes and a token's `data` claim are checked and merged here, case by
//! case at exact values.

use super::{Rules, pb, text};

/// The longest key, in characters (bytes: keys are ASCII).
pub const MAX_KEY_CHARS: usize = 32;

/// A member's data: entries sorted by key, keys unique.
///
/// One thin pointer, null when empty: a room's members hold it beside
/// what the tick reads, so it keeps them as small as they were.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[expect(
    clippy::box_collection,
    reason = "a Box<Vec> is one thin pointer, a Vec three words; data is rare and small"
)]
pub struct Data(Option<Box<Vec<(String, String)>>>);

/// Entries to set: a value replaces the key's, `None` removes the key
/// (an empty value on the wire). Sorted by key, keys unique.
pub type Changes = Vec<(String, Option<String>)>;

/// Why member data was refused: which key, and why. Maps to
/// `ERROR_CODE_INVALID_DATA`.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DataError {
    /// A key breaks the key rule.
    #[error("key {key:?}: {why}")]
    Key { key: String, why: &'static str },
    /// A value breaks the text rule of names and chat.
    #[error("key {key:?}: the value is refused: {why} (values are 1 to {max} characters of text)")]
    Value {
        key: String,
        why: &'static str,
        max: usize,
    },
    /// A key appears twice in one message.
    #[error("key {key:?} appears twice")]
    Duplicate { key: String },
    /// More entries than `max_data_entries`.
    #[error("{count} entries: at most {max} are allowed")]
    TooMany { count: usize, max: usize },
    /// More bytes of keys and values than `max_data_bytes`.
    #[error("{bytes} bytes of keys and values: at most {max} are allowed")]
    TooBig { bytes: usize, max: usize },
    /// The key was set by the token's `data` claim.
    #[error("key {key:?}: set by the token, it cannot change")]
    Claimed { key: String },
}

impl Data {
    /// The entries, sorted by key.
    pub fn entries(&self) -> &[(String, String)] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    pub fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }

    /// Data of sorted, unique `entries`.
    fn of(entries: Vec<(String, String)>) -> Self {
        Self((!entries.is_empty()).then(|| Box::new(entries)))
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        let entries = self.entries();
        entries
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|at| entries[at].1.as_str())
    }

    /// Bytes of keys and values together.
    pub fn bytes(&self) -> usize {
        self.entries().iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// The entries for the wire, in key order.
    pub fn to_pb(&self) -> Vec<pb::DataEntry> {
        self.entries()
            .iter()
            .map(|(key, value)| pb::DataEntry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect()
    }

    /// Checks whole data (a Join's, a token claim's, another node's
    /// member's): every key and value by the rules, keys unique, within
    /// the limits. Sorts the entries.
    pub fn check(entries: Vec<pb::DataEntry>, rules: &Rules) -> Result<Self, DataError> {
        if entries.len() > rules.max_data_entries {
            return Err(DataError::TooMany {
                count: entries.len(),
                max: rules.max_data_entries,
            });
        }
        let mut checked = Vec::with_capacity(entries.len());
        for e in entries {
            let key = check_key(e.key)?;
            let value = check_value(&key, e.value, rules)?;
            checked.push((key, value));
        }
        checked.sort_by(|a, b| a.0.cmp(&b.0));
        unique(&checked)?;
        let data = Self::of(checked);
        data.within(rules)?;
        Ok(data)
    }

    /// `self` with `changes` applied, keys in `claimed` (set by the token)
    /// left alone: a change to one is refused. The result must keep to the
    /// limits.
    pub fn merged(
        &self,
        changes: &[(String, Option<String>)],
        claimed: &Data,
        rules: &Rules,
    ) -> Result<Self, DataError> {
        if let Some((key, _)) = changes.iter().find(|(k, _)| claimed.get(k).is_some()) {
            return Err(DataError::Claimed { key: key.clone() });
        }
        let mut next: Vec<(String, String)> = self.entries().to_vec();
        for (key, value) in changes {
            let at = next.binary_search_by(|(k, _)| k.cmp(key));
            match (at, value) {
                (Ok(at), Some(v)) => next[at].1.clone_from(v),
                (Ok(at), None) => {
                    next.remove(at);
                }
                (Err(at), Some(v)) => next.insert(at, (key.clone(), v.clone())),
                (Err(_), None) => {}
            }
        }
        let data = Self::of(next);
        data.within(rules)?;
        Ok(data)
    }

    /// `asked` (a Join's data) under `claimed` (a token's `data` claim):
    /// the claim's entries win over the Join's with the same keys. The
    /// result must keep to the limits.
    pub fn with_claims(asked: Self, claimed: &Data, rules: &Rules) -> Result<Self, DataError> {
        if claimed.is_empty() {
            return Ok(asked);
        }
        let mut all: Vec<(String, String)> = claimed.entries().to_vec();
        all.extend(
            asked
                .0
                .map_or_else(Vec::new, |b| *b)
                .into_iter()
                .filter(|(k, _)| claimed.get(k).is_none()),
        );
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let data = Self::of(all);
        data.within(rules)?;
        Ok(data)
    }

    fn within(&self, rules: &Rules) -> Result<(), DataError> {
        if self.entries().len() > rules.max_data_entries {
            return Err(DataError::TooMany {
                count: self.entries().len(),
                max: rules.max_data_entries,
            });
        }
        let bytes = self.bytes();
        if bytes > rules.max_data_bytes {
            return Err(DataError::TooBig {
                bytes,
                max: rules.max_data_bytes,
            });
        }
        Ok(())
    }
}

/// Checks a `SetData`'s entries: keys by the key rule and unique, values
/// by the text rule, an empty value removing the key. Sorted by key. How
/// many a member may then hold is [`Data::merged`]'s to check; a message
/// with more changes than a member can hold entries is refused here.
pub fn check_changes(entries: Vec<pb::DataEntry>, rules: &Rules) -> Result<Changes, DataError> {
    // Each key at most once, so more changes than that many keys cannot
    // be unique within the limits (one removal per held key, one set per
    // free entry).
    let max = rules.max_data_entries.saturating_mul(2);
    if entries.len() > max {
        return Err(DataError::TooMany {
            count: entries.len(),
            max,
        });
    }
    let mut changes = Vec::with_capacity(entries.len());
    for e in entries {
        let key = check_key(e.key)?;
        let value = if e.value.is_empty() {
            None
        } else {
            Some(check_value(&key, e.value, rules)?)
        };
        changes.push((key, value));
    }
    changes.sort_by(|a, b| a.0.cmp(&b.0));
    unique(&changes)?;
    Ok(changes)
}

/// A key: 1 to [`MAX_KEY_CHARS`] characters of `[a-z0-9_.-]`.
pub fn check_key(key: String) -> Result<String, DataError> {
    let why = if key.is_empty() {
        "empty key"
    } else if key.len() > MAX_KEY_CHARS {
        "key longer than 32 characters"
    } else if !key
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-'))
    {
        "keys take only a-z, 0-9, '_', '.' and '-'"
    } else {
        return Ok(key);
    };
    // A bad key is shown cut short: it may be long, or not printable.
    Err(DataError::Key {
        key: key.chars().take(MAX_KEY_CHARS).collect(),
        why,
    })
}

/// A value of `key`, normalised by the text rule of names and chat.
fn check_value(key: &str, value: String, rules: &Rules) -> Result<String, DataError> {
    text::normalize(value, rules.max_data_value_chars).map_err(|p| DataError::Value {
        key: key.to_owned(),
        why: p.reason(),
        max: rules.max_data_value_chars,
    })
}

/// Refuses a key that appears twice in sorted `entries`.
fn unique<V>(entries: &[(String, V)]) -> Result<(), DataError> {
    match entries.windows(2).find(|w| w[0].0 == w[1].0) {
        Some(w) => Err(DataError::Duplicate {
            key: w[0].0.clone(),
        }),
        None => Ok(()),
    }
}
