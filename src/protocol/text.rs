//! The rule for text that people read: display names and chat.
//!
//! One rule for both, in one place. The text is normalised to NFC (so one
//! name has one spelling, and lengths count what a reader sees), then
//! refused when it is empty or too long, when it holds a control
//! character, a bidirectional override or isolate, or a line or paragraph
//! separator, or when it would render blank: nothing in it but white space,
//! default-ignorable, format or filler characters. docs/protocol.md lists
//! the classes; `web/amble.js` mirrors them.

use std::borrow::Cow;

use icu_normalizer::ComposingNormalizerBorrowed;
use icu_properties::props::{DefaultIgnorableCodePoint, GeneralCategory, WhiteSpace};
use icu_properties::{CodePointMapData, CodePointSetData, CodePointSetDataBorrowed};

/// Why a name or chat text was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextProblem {
    /// No characters at all.
    Empty,
    /// More characters, after normalisation, than allowed.
    TooLong,
    /// A control character (general category Cc: C0, DEL, C1).
    Control,
    /// A bidirectional embedding, override or isolate (U+202A-U+202E,
    /// U+2066-U+2069): it reorders the text after it, even other people's.
    Bidi,
    /// A line or paragraph separator (U+2028, U+2029).
    Separator,
    /// Nothing that renders: only white space, default-ignorable, format
    /// or filler characters.
    Blank,
}

impl TextProblem {
    /// The reason given to the client.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::TooLong => "too long",
            Self::Control => "control characters",
            Self::Bidi => "bidirectional overrides or isolates (U+202A-U+202E, U+2066-U+2069)",
            Self::Separator => "line or paragraph separators (U+2028, U+2029)",
            Self::Blank => "blank: only spaces, invisible or filler characters",
        }
    }
}

/// What one character is to the rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Renders as something a reader sees.
    Visible,
    /// Allowed, but renders as nothing (or as white space).
    Invisible,
    /// Refused: [`TextProblem::Control`].
    Control,
    /// Refused: [`TextProblem::Bidi`].
    Bidi,
    /// Refused: [`TextProblem::Separator`].
    Separator,
}

/// Characters that render blank by design and that no Unicode property
/// above marks as invisible: U+2800 BRAILLE PATTERN BLANK, U+1D159 MUSICAL
/// SYMBOL NULL NOTEHEAD and U+16FE4 KHITAN SMALL SCRIPT FILLER.
const BLANK_GLYPHS: [char; 3] = ['\u{2800}', '\u{1D159}', '\u{16FE4}'];

const NFC: ComposingNormalizerBorrowed<'static> = ComposingNormalizerBorrowed::new_nfc();
const WHITE_SPACE: CodePointSetDataBorrowed<'static> = CodePointSetData::new::<WhiteSpace>();
const DEFAULT_IGNORABLE: CodePointSetDataBorrowed<'static> =
    CodePointSetData::new::<DefaultIgnorableCodePoint>();

/// Sorts one character.
pub fn class(c: char) -> Class {
    if matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}') {
        return Class::Bidi;
    }
    match CodePointMapData::<GeneralCategory>::new().get(c) {
        GeneralCategory::Control => Class::Control,
        GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator => Class::Separator,
        GeneralCategory::Format | GeneralCategory::SpaceSeparator => Class::Invisible,
        _ if WHITE_SPACE.contains(c)
            || DEFAULT_IGNORABLE.contains(c)
            || BLANK_GLYPHS.contains(&c) =>
        {
            Class::Invisible
        }
        _ => Class::Visible,
    }
}

/// `text` in NFC, or the reason it is refused. At most `max_chars`
/// characters (Unicode scalar values), counted after normalisation.
pub fn normalize(text: String, max_chars: usize) -> Result<String, TextProblem> {
    let text = match NFC.normalize(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(normalized) => normalized,
    };
    check(&text, max_chars)?;
    Ok(text)
}

/// Checks text that is already in NFC.
fn check(text: &str, max_chars: usize) -> Result<(), TextProblem> {
    if text.is_empty() {
        return Err(TextProblem::Empty);
    }
    if text.chars().count() > max_chars {
        return Err(TextProblem::TooLong);
    }
    let mut visible = false;
    for c in text.chars() {
        match class(c) {
            Class::Visible => visible = true,
            Class::Invisible => {}
            Class::Control => return Err(TextProblem::Control),
            Class::Bidi => return Err(TextProblem::Bidi),
            Class::Separator => return Err(TextProblem::Separator),
        }
    }
    if visible {
        Ok(())
    } else {
        Err(TextProblem::Blank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use icu_normalizer::DecomposingNormalizerBorrowed;
    use proptest::prelude::*;

    const MAX: usize = 32;

    fn ok(s: &str) -> Result<String, TextProblem> {
        normalize(s.to_owned(), MAX)
    }

    /// Every character the rule names, by class.
    const BIDI: [char; 9] = [
        '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}',
        '\u{2068}', '\u{2069}',
    ];
    const SEPARATORS: [char; 2] = ['\u{2028}', '\u{2029}'];
    const CONTROLS: [char; 6] = ['\0', '\t', '\n', '\r', '\u{7F}', '\u{85}'];
    /// Characters known to render blank (the classes' well-known members).
    const BLANKS: [char; 34] = [
        ' ',
        '\u{A0}',
        '\u{AD}',
        '\u{34F}',
        '\u{61C}',
        '\u{115F}',
        '\u{1160}',
        '\u{17B4}',
        '\u{17B5}',
        '\u{180E}',
        '\u{2000}',
        '\u{2007}',
        '\u{200A}',
        '\u{200B}',
        '\u{200C}',
        '\u{200D}',
        '\u{200E}',
        '\u{200F}',
        '\u{202F}',
        '\u{205F}',
        '\u{2060}',
        '\u{2064}',
        '\u{2800}',
        '\u{3000}',
        '\u{3164}',
        '\u{FE0F}',
        '\u{FEFF}',
        '\u{FFA0}',
        '\u{1D159}',
        '\u{1D173}',
        '\u{16FE4}',
        '\u{E0020}',
        '\u{E0001}',
        '\u{1680}',
    ];

    #[test]
    fn each_named_character_is_sorted_into_its_class() {
        for c in BIDI {
            assert_eq!(class(c), Class::Bidi, "U+{:04X}", c as u32);
        }
        for c in SEPARATORS {
            assert_eq!(class(c), Class::Separator, "U+{:04X}", c as u32);
        }
        for c in CONTROLS {
            assert_eq!(class(c), Class::Control, "U+{:04X}", c as u32);
        }
        for c in BLANKS {
            assert_eq!(class(c), Class::Invisible, "U+{:04X}", c as u32);
        }
        for c in [
            'a', 'Z', '0', '.', 'é', 'ß', '한', 'ㄱ', 'م', '🌿', '\u{301}', '\u{E000}',
        ] {
            assert_eq!(class(c), Class::Visible, "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn ordinary_names_pass_unchanged() {
        for name in [
            "Ada Lovelace",
            "Zoë 🌿",
            "李小龙",
            "مرحبا",
            "한국어",
            "می\u{200C}خواهم", // a zero-width non-joiner inside a Persian word
            "👨\u{200D}👩\u{200D}👧", // an emoji ZWJ sequence
            "A\u{200B}B",
            "  padded  ",
        ] {
            assert_eq!(ok(name).as_deref(), Ok(name), "{name:?}");
        }
    }

    #[test]
    fn text_is_normalised_to_nfc_and_counted_after() {
        assert_eq!(ok("Zoe\u{308}").as_deref(), Ok("Zoë"));
        assert_eq!(ok("\u{212B}").as_deref(), Ok("\u{C5}"), "ANGSTROM SIGN");
        // 32 decomposed é are 64 code points, but 32 characters in NFC.
        let decomposed = "e\u{301}".repeat(MAX);
        assert_eq!(ok(&decomposed), Ok("é".repeat(MAX)));
        assert_eq!(ok(&"é".repeat(MAX + 1)), Err(TextProblem::TooLong));
    }

    #[test]
    fn refusals_name_their_reason() {
        assert_eq!(ok(""), Err(TextProblem::Empty));
        assert_eq!(ok("   "), Err(TextProblem::Blank));
        assert_eq!(ok("\u{200B}\u{FEFF}"), Err(TextProblem::Blank));
        assert_eq!(ok("\u{3164}"), Err(TextProblem::Blank), "HANGUL FILLER");
        assert_eq!(ok("\u{115F}\u{1160}"), Err(TextProblem::Blank));
        assert_eq!(ok("\u{2800}\u{2800}"), Err(TextProblem::Blank));
        assert_eq!(ok("admin\u{202E}txt.exe"), Err(TextProblem::Bidi));
        assert_eq!(ok("a\u{2067}b"), Err(TextProblem::Bidi));
        assert_eq!(ok("line\u{2028}break"), Err(TextProblem::Separator));
        assert_eq!(ok("bell\u{7}"), Err(TextProblem::Control));
        assert_eq!(ok("new\nline"), Err(TextProblem::Control));
        assert_eq!(ok(&"n".repeat(MAX + 1)), Err(TextProblem::TooLong));
    }

    /// Characters worth mixing into generated text: the rule's named
    /// classes, combining marks and compositions, and ordinary letters.
    fn interesting() -> impl Strategy<Value = char> {
        let named: Vec<char> = BIDI
            .into_iter()
            .chain(SEPARATORS)
            .chain(CONTROLS)
            .chain(BLANKS)
            .chain([
                'e', '\u{301}', '\u{308}', 'A', '\u{212B}', '\u{1100}', '\u{1161}', 'ㄱ',
            ])
            .collect();
        prop_oneof![any::<char>(), prop::sample::select(named)]
    }

    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(interesting(), 0..40).prop_map(|cs| cs.into_iter().collect())
    }

    fn blank_text() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(BLANKS.to_vec()), 0..40)
            .prop_map(|cs| cs.into_iter().collect())
    }

    proptest! {
        /// What the rule accepts is NFC, and accepting it again changes nothing.
        #[test]
        fn accepted_text_is_nfc_and_a_fixed_point(s in text()) {
            if let Ok(out) = normalize(s, MAX) {
                prop_assert!(NFC.is_normalized(&out));
                prop_assert_eq!(normalize(out.clone(), MAX), Ok(out));
            }
        }

        /// The verdict is the same for every spelling of the same text:
        /// nothing refused is accepted once normalised (or decomposed).
        #[test]
        fn the_verdict_does_not_depend_on_the_spelling(s in text()) {
            let nfd = DecomposingNormalizerBorrowed::new_nfd();
            let verdict = normalize(s.clone(), MAX);
            prop_assert_eq!(normalize(NFC.normalize(&s).into_owned(), MAX), verdict.clone());
            prop_assert_eq!(normalize(nfd.normalize(&s).into_owned(), MAX), verdict);
        }

        /// Accepted text has something visible, and none of the refused
        /// characters; text made only of blank characters is refused.
        #[test]
        fn no_accepted_text_renders_blank(s in text(), blank in blank_text()) {
            if let Ok(out) = normalize(s, MAX) {
                prop_assert!(out.chars().any(|c| !BLANKS.contains(&c) && !c.is_whitespace()));
                let refused = |c: char| {
                    c.is_control() || BIDI.contains(&c) || SEPARATORS.contains(&c)
                };
                prop_assert!(!out.chars().any(refused), "{:?}", out);
            }
            prop_assert!(normalize(blank, MAX).is_err());
        }

        /// A refused character anywhere refuses the whole text.
        #[test]
        fn a_refused_character_anywhere_refuses(
            before in text(),
            after in text(),
            bad in prop::sample::select(
                BIDI.into_iter().chain(SEPARATORS).chain(CONTROLS).collect::<Vec<_>>()
            ),
        ) {
            let s = format!("{before}{bad}{after}");
            prop_assert!(normalize(s, 1_000).is_err());
        }

        /// Normalisation never lets a text past the length limit.
        #[test]
        fn accepted_text_keeps_to_the_length(s in text(), max in 1usize..40) {
            if let Ok(out) = normalize(s, max) {
                prop_assert!(out.chars().count() <= max);
            }
        }
    }
}
